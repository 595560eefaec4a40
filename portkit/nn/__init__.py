"""Layers with parameters, state dicts, and safetensors files (written with numpy).

A layer holds its parameters and calls portkit.nn.functional, where the computation lives.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from portkit.abi import dtypes
from portkit.nn import functional as F
from portkit.tensor import Tensor, realize


class Module:
    """Base of layers: finds its parameters by walking attributes (tensors, modules, lists)."""

    training = True

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of this module and its children, by dotted name."""
        out: dict[str, Tensor] = {}
        for name, value in vars(self).items():
            _collect(value, prefix + name, out)
        return out

    def parameters(self) -> list[Tensor]:
        """The tensors that require gradients (what an optimizer updates)."""
        return [t for t in self.state_dict().values() if t.requires_grad]

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) of each parameter, as torch's named_parameters()."""
        return [(n, t) for n, t in self.state_dict().items() if t.requires_grad]

    def zero_grad(self) -> None:
        """Drops every parameter's gradient (None, as torch's set_to_none default)."""
        for t in self.parameters():
            t.grad = None

    def load_state_dict(self, state: dict[str, Tensor | np.ndarray], strict: bool = True) -> None:
        """Copies values into this module's tensors; names and shapes must match."""
        own = self.state_dict()
        missing, unexpected = set(own) - set(state), set(state) - set(own)
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {sorted(missing)}, unexpected "
                           f"{sorted(unexpected)}")
        for name, value in state.items():
            if name not in own:
                continue
            array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if array.shape != own[name].shape:
                raise ValueError(f"load_state_dict: {name} has shape {own[name].shape}, the "
                                 f"state has {array.shape}")
            own[name].assign(Tensor(array, own[name].dtype, own[name].device))

    def train(self, mode: bool = True) -> Module:
        """Sets training mode (dropout active, batch statistics) here and in every child."""
        for module in [self, *_modules(self)]:
            module.training = mode
        return self

    def eval(self) -> Module:
        """train(False)."""
        return self.train(False)

    def __call__(self, *args, **kwargs) -> Tensor:
        return self.forward(*args, **kwargs)


def _collect(value, name: str, out: dict) -> None:
    # a module's tensors are found under its attribute's name, as torch names them
    if isinstance(value, Tensor):
        out[name] = value
    elif isinstance(value, Module):
        out.update(value.state_dict(name + "."))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _collect(item, f"{name}.{i}", out)


def _modules(module: Module) -> list[Module]:
    found = []
    for value in vars(module).values():
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, Module):
                found += [item, *_modules(item)]
    return found


def _uniform(shape: tuple[int, ...], bound: float) -> Tensor:
    return (Tensor.rand(*shape) * (2 * bound) - bound).realize().requires_grad_()


class Linear(Module):
    """y = x @ weight.T + bias, initialized as torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform((out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Conv2d(Module):
    """2-d convolution layer, initialized as torch.nn.Conv2d."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True):
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        bound = 1 / math.sqrt(in_channels // groups * kh * kw)
        self.weight = _uniform((out_channels, in_channels // groups, kh, kw), bound)
        self.bias = _uniform((out_channels,), bound) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class LayerNorm(Module):
    """Normalizes the last len(shape) dims, then scales and shifts."""

    def __init__(self, shape, eps: float = 1e-5, elementwise_affine: bool = True):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.shape).contiguous().realize().requires_grad_() \
            if elementwise_affine else None
        self.bias = Tensor.zeros(*self.shape).contiguous().realize().requires_grad_() \
            if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        axes = tuple(range(-len(self.shape), 0))
        x = F.layernorm(x, axes, self.eps)
        return x if self.weight is None else x * self.weight + self.bias


class BatchNorm2d(Module):
    """Batch normalization over (N, H, W) per channel, with running statistics."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        self.eps, self.momentum = eps, momentum
        self.weight = Tensor.ones(channels).contiguous().realize().requires_grad_()
        self.bias = Tensor.zeros(channels).contiguous().realize().requires_grad_()
        self.running_mean = Tensor.zeros(channels).contiguous().realize()
        self.running_var = Tensor.ones(channels).contiguous().realize()

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            mean = x.mean((0, 2, 3))
            centered = x - mean.reshape(1, -1, 1, 1)
            var = (centered * centered).mean((0, 2, 3))
            count = x.numel() // x.shape[1]
            m = self.momentum
            self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
            self.running_var.assign(self.running_var * (1 - m) +
                                    var.detach() * (m * count / max(count - 1, 1)))
            realize(self.running_mean, self.running_var)
        else:
            mean, var = self.running_mean, self.running_var
        return F.batchnorm(x, self.weight, self.bias, mean, (var + self.eps).rsqrt())


class Embedding(Module):
    """A table of vectors looked up by integer index."""

    def __init__(self, count: int, dim: int):
        self.weight = Tensor.randn(count, dim).realize().requires_grad_()

    def forward(self, index: Tensor) -> Tensor:
        return F.embedding(index, self.weight)


# -- safetensors: 8-byte little-endian header length, JSON header, raw little-endian data --------

_CODES = {"bool": "BOOL", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
          "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16",
          "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_NAMES = {code: name for name, code in _CODES.items()}


def save_safetensors(state: dict[str, Tensor], path: str | Path) -> None:
    """Writes tensors to a .safetensors file (the format is simple enough for numpy alone)."""
    header, blobs, offset = {}, [], 0
    for name, tensor in state.items():
        data = np.ascontiguousarray(tensor.numpy()).tobytes()
        header[name] = {"dtype": _CODES[tensor.dtype.name], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.writelines(blobs)


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Reads a .safetensors file into numpy arrays, by name."""
    raw = Path(path).read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = dtypes.by_name(_NAMES[info["dtype"]]).np
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + size + start:8 + size + end], dtype).reshape(
            info["shape"]).copy()
    return out


# after Module: the containers subclass it
from portkit.nn.containers import (
    ELU,
    GELU,
    Dropout,
    Flatten,
    Hardswish,
    LeakyReLU,
    Mish,
    ModuleList,
    ReLU,
    ReLU6,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)

__all__ = ["ELU", "GELU", "BatchNorm2d", "Conv2d", "Dropout", "Embedding", "Flatten",
           "Hardswish", "LayerNorm", "LeakyReLU", "Linear", "Mish", "Module", "ModuleList", "ReLU",
           "ReLU6", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softplus", "Tanh",
           "load_safetensors", "save_safetensors"]
