"""`Module`: the base of layers, which finds its parameters by walking its attributes; and the
initial values of layers, computed together on first use (`deferred`)."""
from __future__ import annotations

import numpy as np

from portkit.abi import PortkitError, dtypes
from portkit.graph import gc_paused
from portkit.tensor import DTypeLike, Tensor, realize
from portkit.tensor.dtype import to_dtype

_DTYPE_NAMES = frozenset(d.name for d in dtypes.ALL)
# initial values made since the last realize_deferred(), in the order they were made
_deferred: list[Tensor] = []


class Module:
    """Base of layers: finds its parameters by walking attributes (tensors, modules, lists)."""

    training = True

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of this module and its children, by dotted name (initial values
        computed: realize_deferred)."""
        realize_deferred()
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

    def to(self, device: str | DTypeLike | None = None, dtype: DTypeLike | None = None
           ) -> Module:
        """Moves every tensor to `device` and casts the float ones to `dtype` (either may come
        first, as torch's); the tensors stay the same objects, so optimizers keep them."""
        if device is not None and (not isinstance(device, str) or device in _DTYPE_NAMES):
            device, dtype = None, device
        dtype = to_dtype(dtype)
        moved = [t for t in self.state_dict().values()]
        moved += [t.grad for t in moved if t.grad is not None]
        for t in moved:
            value = Tensor(t.lazy)          # no autograd record: t stays a leaf
            if device is not None:
                value = value.to(device)
            if dtype is not None and value.dtype.is_float:
                value = value.cast(dtype)
            t.lazy = value.lazy
        realize(*moved)
        return self

    def train(self, mode: bool = True) -> Module:
        """Sets training mode (dropout active, batch statistics) here and in every child."""
        for module in [self, *_modules(self)]:
            module.training = mode
        return self

    def eval(self) -> Module:
        """train(False)."""
        return self.train(False)

    @gc_paused
    def __call__(self, *args, **kwargs) -> Tensor:
        # A forward pass builds a graph's worth of objects that live until backward: the
        # collections their allocations set off would walk every live object and free nothing
        # (graph.gc_paused); an eager LSTM step spent a third of its CPU time in them.
        realize_deferred()
        return self.forward(*args, **kwargs)

    def named_children(self) -> list[tuple[str, Module]]:
        """(name, module) of each direct child, in the order they were set; a list of modules
        gives "name.0", "name.1", ..."""
        found = []
        for name, value in vars(self).items():
            if isinstance(value, Module):
                found.append((name, value))
            elif isinstance(value, list | tuple):
                found += [(f"{name}.{i}", item) for i, item in enumerate(value)
                          if isinstance(item, Module)]
        return found

    def extra_repr(self) -> str:
        """The settings shown inside this module's parentheses (override it, as in torch)."""
        return ""

    def __repr__(self) -> str:
        """The module tree as torch prints it: `Name(settings)`, children indented below."""
        lines = [f"({name}): " + repr(child).replace("\n", "\n  ")
                 for name, child in self.named_children()]
        if not lines:
            return f"{type(self).__name__}({self.extra_repr()})"
        head = [self.extra_repr()] if self.extra_repr() else []
        return f"{type(self).__name__}(\n" + "".join(f"  {line}\n"
                                                      for line in head + lines) + ")"


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
    return [found for _, child in module.named_children() for found in [child, *_modules(child)]]


def uniform_parameter(shape: tuple[int, ...], bound: float) -> Tensor:
    """A parameter drawn uniformly from [-bound, bound], as torch initializes its layers."""
    return deferred(Tensor.rand(*shape) * (2 * bound) - bound).requires_grad_()


def deferred(tensor: Tensor) -> Tensor:
    """`tensor`, a layer's initial value, left lazy until `realize_deferred`: a model's
    initial values then compile as one batch and run as one schedule, where one realize each
    compiled each layer's kernels on their own (the random draws are counter-based, so the
    values do not depend on when they are computed)."""
    _deferred.append(tensor)
    return tensor


def realize_deferred() -> None:
    """Computes every initial value made since the last call (`deferred`) in one schedule; a
    module's call, state_dict() and parameters() call it."""
    if _deferred:
        pending = _deferred[:]
        _deferred.clear()
        try:
            realize(*pending)
        except PortkitError:
            # a device that has gone since (a test's own): each value is still a lazy graph,
            # computed where it is used, and the error, if it is this model's, shows there
            pass

