"""Autograd: every primitive op, its forward and its gradient rule, in one table (GRADIENTS).

A primitive's forward works on lazy graph nodes; its backward gets the output gradient (a
Tensor) and returns one gradient per input (None where no gradient flows), written with Tensor
ops. So the backward pass is itself a lazy graph: it fuses and schedules like the forward.
Every other Tensor op is a composition of these primitives and needs no rule of its own.
"""
from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from portkit import graph
from portkit.abi.ops import Op
from portkit.graph import Lazy


@dataclass(frozen=True)
class Rule:
    """forward(*lazy inputs, arg) -> lazy output; backward(ctx, grad) -> grads of the inputs."""

    forward: Callable[..., Lazy]
    backward: Callable[..., tuple] | None     # None: not differentiable (comparisons, ints)


class Context:
    """What a backward rule may read: the inputs, the output and the op's argument."""

    __slots__ = ("arg", "inputs", "lazy")

    def __init__(self, inputs: tuple, lazy: Lazy, arg: Any):
        self.inputs, self.lazy, self.arg = inputs, lazy, arg     # inputs: Tensors

    @property
    def out(self):
        """The output's lazy node as a Tensor cut from the graph (made only when a rule
        reads it: most do not)."""
        return type(self.inputs[0])(self.lazy)


def _alu(op: Op) -> Callable[..., Lazy]:
    return lambda *srcs, arg=None: srcs[0].alu(op, *srcs[1:])


_LN2 = math.log(2)

GRADIENTS: dict[str, Rule] = {
    # unary
    "neg": Rule(_alu(Op.NEG), lambda c, g: (-g,)),
    "recip": Rule(_alu(Op.RECIP), lambda c, g: (-g * c.out * c.out,)),
    "sqrt": Rule(_alu(Op.SQRT), lambda c, g: (g / (c.out * 2),)),
    "exp2": Rule(_alu(Op.EXP2), lambda c, g: (g * c.out * _LN2,)),
    "log2": Rule(_alu(Op.LOG2), lambda c, g: (g / (c.inputs[0] * _LN2),)),
    "sin": Rule(_alu(Op.SIN), lambda c, g: (g * c.inputs[0].detach().cos(),)),
    "trunc": Rule(_alu(Op.TRUNC), lambda c, g: (g.zeros_like(),)),
    # binary (inputs already broadcast to one shape and promoted to one dtype)
    "add": Rule(_alu(Op.ADD), lambda c, g: (g, g)),
    "sub": Rule(_alu(Op.SUB), lambda c, g: (g, -g)),
    "mul": Rule(_alu(Op.MUL), lambda c, g: (g * c.inputs[1].detach(),
                                            g * c.inputs[0].detach())),
    "div": Rule(_alu(Op.FDIV), lambda c, g: (
        g / c.inputs[1].detach(),
        -g * c.inputs[0].detach() / (c.inputs[1].detach() * c.inputs[1].detach()))),
    "max": Rule(_alu(Op.MAX), lambda c, g: _max_grads(c, g)),
    "lt": Rule(_alu(Op.CMPLT), None),
    "ne": Rule(_alu(Op.CMPNE), None),
    "idiv": Rule(_alu(Op.IDIV), None),
    "mod": Rule(_alu(Op.MOD), None),
    "and": Rule(_alu(Op.AND), None),
    "or": Rule(_alu(Op.OR), None),
    "xor": Rule(_alu(Op.XOR), None),
    "shl": Rule(_alu(Op.SHL), None),
    "shr": Rule(_alu(Op.SHR), None),
    "where": Rule(_alu(Op.WHERE), lambda c, g: (
        None, c.inputs[0]._where(g, 0.0), c.inputs[0]._where(0.0, g))),
    "cast": Rule(lambda x, arg: x.cast(arg),
                 lambda c, g: (g.cast(c.inputs[0].dtype),)),
    "bitcast": Rule(lambda x, arg: x.cast(arg, bitcast=True), None),
    # reductions (reduced axes keep size 1)
    "sum": Rule(lambda x, arg: x.reduce(Op.ADD, arg),
                lambda c, g: (g.expand(c.inputs[0].shape),)),
    "max_reduce": Rule(lambda x, arg: x.reduce(Op.MAX, arg), lambda c, g: _max_reduce_grad(c, g)),
    "prod_reduce": Rule(lambda x, arg: x.reduce(Op.MUL, arg), lambda c, g: _prod_grad(c, g)),
    # movement
    "reshape": Rule(lambda x, arg: x.view("reshape", arg),
                    lambda c, g: (g.reshape(c.inputs[0].shape),)),
    "permute": Rule(lambda x, arg: x.view("permute", arg), lambda c, g: (
        g.permute(tuple(sorted(range(len(c.arg)), key=c.arg.__getitem__))),)),
    "expand": Rule(lambda x, arg: x.view("expand", arg), lambda c, g: (
        g._reduce_prim("sum", tuple(i for i, (a, b) in enumerate(zip(c.inputs[0].shape, c.arg))
                                    if a != b)),)),
    "pad": Rule(lambda x, arg: x.view("pad", arg), lambda c, g: (
        g.shrink(tuple((lo, lo + s) for (lo, _), s in zip(c.arg, c.inputs[0].shape))),)),
    "shrink": Rule(lambda x, arg: x.view("shrink", arg), lambda c, g: (
        g.pad(tuple((b, s - e) for (b, e), s in zip(c.arg, c.inputs[0].shape))),)),
    "flip": Rule(lambda x, arg: x.view("flip", arg), lambda c, g: (g.flip(c.arg),)),
    # rows of a source picked by an index along one axis; its gradient sums the output
    # gradient's rows into the positions they came from (Tensor._gather_grad)
    "gather": Rule(lambda x, index, fault, arg: x.gather(index, fault, arg), lambda c, g: (
        g._gather_grad(c.inputs[1], c.arg, c.inputs[0].shape[c.arg.axis]), None, None)),
    "copy": Rule(lambda x, arg: x.copy_to(arg), lambda c, g: (g.to(c.inputs[0].device),)),
    # a value whose derivatives are given: inputs (value, x1, d value/d x1, x2, ...), so an op
    # computes its value by any formula and still gets the derivative PyTorch defines
    "given_grad": Rule(lambda value, *rest, arg=None: value, lambda c, g: (None,) + tuple(
        grad for d in c.inputs[2::2] for grad in (g * d, None))),
    # a value whose gradients a function gives: inputs (value, x1, x2, ...), arg(g) returns the
    # gradients of x1, x2, ... (a convolution's input gradient is a transposed convolution,
    # where the gradients of its windows would sum nine shifted copies of a 9x larger tensor)
    "given_vjp": Rule(lambda value, *rest, arg=None: value,
                      lambda c, g: (None,) + tuple(c.arg(g))),
}


def _max_grads(c: Context, g) -> tuple:
    x, y = (t.detach() for t in c.inputs)
    # ties split the gradient evenly, as torch.maximum does
    share = (x > y)._where(1.0, (x == y)._where(0.5, 0.0)).cast(g.dtype)
    return g * share, g * (1.0 - share)


def _max_reduce_grad(c: Context, g) -> tuple:
    x = c.inputs[0].detach()
    hit = (x == c.out.expand(x.shape)).cast(g.dtype)
    count = hit._reduce_prim("sum", c.arg).expand(x.shape)
    return (g.expand(x.shape) * hit / count,)


def _prod_grad(c: Context, g) -> tuple:
    # d(prod)/dx_i is the product of the others: out / x_i only while no x is zero. With one
    # zero, only that element gets a gradient (the product of the nonzeros); with two, none does.
    x = c.inputs[0].detach()
    zero = x == 0
    zeros = zero.cast(x.dtype)._reduce_prim("sum", c.arg).expand(x.shape)
    safe = zero._where(1.0, x)
    nonzero_prod = safe._reduce_prim("prod_reduce", c.arg).expand(x.shape)
    others = (zeros == 0)._where(nonzero_prod / safe, (zero & (zeros == 1))._where(nonzero_prod,
                                                                                  0.0))
    return (g.expand(x.shape) * others,)


# -- recording and the backward pass --------------------------------------------------------

# per thread, as PyTorch's: one thread's no_grad() must not change what another records
_state = threading.local()

# what backward() leaves in `_ctx` of the tensors it walked: their graph is gone
FREED = ("freed", None)


def note_loss(loss: Lazy) -> None:
    """Remembers (in this thread) a scalar that backward() ran from: the next optimizer step
    computes it in the same schedule as the updates (`take_losses`)."""
    losses = getattr(_state, "losses", None)
    if losses is None:
        losses = _state.losses = []
    losses.append(weakref.ref(loss))


def take_losses() -> list[Lazy]:
    """The scalars `note_loss` remembered since the last call that are still unrealized."""
    losses, _state.losses = getattr(_state, "losses", None) or [], []
    return [lazy for ref in losses if (lazy := ref()) is not None and not lazy.realized]


def grad_enabled() -> bool:
    """False inside `no_grad()` (in this thread): ops then record nothing for backward."""
    return getattr(_state, "enabled", True)


@contextmanager
def no_grad():
    """Inside this block no op of this thread records its inputs for backward."""
    previous, _state.enabled = grad_enabled(), False
    try:
        yield
    finally:
        _state.enabled = previous


@graph.gc_paused
def backward(root, grad) -> None:
    """Accumulates d(root)/d(leaf) * grad into `.grad` of every leaf that requires it."""
    # Tensors that recorded an op, sources first; a leaf (no record) ends the walk. Inputs are
    # walked right to left, the order gradients have always been summed in.
    if root._ctx is None:       # a leaf (a 0-d sum or reshape of itself returns it)
        root.grad = grad if root.grad is None else root.grad + grad
        return
    found = graph.walk(
        [root], stop=lambda t: t._ctx is None or t._ctx is FREED,
        sources=lambda t: [p for p in t._ctx[1].inputs if p.requires_grad][::-1])
    order = found.order
    # a freed node stops the walk, so it is among the stopped ones: its gradient would go
    # nowhere (PyTorch raises too)
    if any(t._ctx is FREED for t in found.stopped):
        raise RuntimeError("backward() through a graph that an earlier backward() freed; "
                           "compute the result again")
    grads = {id(root): grad}
    for t in reversed(order):
        g = grads.pop(id(t), None)
        if g is None:
            continue
        name, ctx = t._ctx
        for parent, pg in zip(ctx.inputs, GRADIENTS[name].backward(ctx, g)):
            if pg is None or not parent.requires_grad:
                continue
            if parent._ctx is None:
                parent.grad = pg if parent.grad is None else parent.grad + pg
            else:
                grads[id(parent)] = pg if id(parent) not in grads else grads[id(parent)] + pg
        t._ctx = FREED
