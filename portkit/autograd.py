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
    """What a backward rule may read: the inputs, the output and the op's argument; and the
    op's name (its rule), kept here rather than in a pair beside it: an object fewer per op."""

    __slots__ = ("arg", "inputs", "lazy", "name")

    def __init__(self, name: str, inputs: tuple, lazy: Lazy | None, arg: Any):
        self.name, self.inputs, self.lazy, self.arg = name, inputs, lazy, arg  # inputs: Tensors

    @property
    def out(self):
        """The output's lazy node as a Tensor cut from the graph (made only when a rule
        reads it: most do not)."""
        return type(self.inputs[0])(self.lazy)


def _alu(op: Op) -> Callable[..., Lazy]:
    def forward(first: Lazy, *others: Lazy, arg: Any = None) -> Lazy:
        return first.alu(op, *others)
    return forward


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
    "mul": Rule(_alu(Op.MUL), lambda c, g: (_times(g, c.inputs[1].detach()),
                                            _times(g, c.inputs[0].detach()))),
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
                lambda c, g: (_moved(g, "expand", c.inputs[0].shape, c.inputs[0].shape),)),
    "max_reduce": Rule(lambda x, arg: x.reduce(Op.MAX, arg), lambda c, g: _max_reduce_grad(c, g)),
    "prod_reduce": Rule(lambda x, arg: x.reduce(Op.MUL, arg), lambda c, g: _prod_grad(c, g)),
    # movement
    "reshape": Rule(lambda x, arg: x.view("reshape", arg),
                    lambda c, g: (_moved(g, "reshape", c.inputs[0].shape, c.inputs[0].shape),)),
    "permute": Rule(lambda x, arg: x.view("permute", arg), lambda c, g: (_moved(
        g, "permute", tuple(sorted(range(len(c.arg)), key=c.arg.__getitem__)),
        c.inputs[0].shape),)),
    "expand": Rule(lambda x, arg: x.view("expand", arg), lambda c, g: (
        g._reduce_prim("sum", tuple(i for i, (a, b) in enumerate(zip(c.inputs[0].shape, c.arg))
                                    if a != b)),)),
    "pad": Rule(lambda x, arg: x.view("pad", arg), lambda c, g: (_moved(
        g, "shrink", tuple((lo, lo + s) for (lo, _), s in zip(c.arg, c.inputs[0].shape)),
        c.inputs[0].shape),)),
    "shrink": Rule(lambda x, arg: x.view("shrink", arg), lambda c, g: (_moved(
        g, "pad", tuple((b, s - e) for (b, e), s in zip(c.arg, c.inputs[0].shape)),
        c.inputs[0].shape),)),
    "flip": Rule(lambda x, arg: x.view("flip", arg), lambda c, g: (g.flip(c.arg),)),
    # rows of a source picked by an index along one axis; its gradient sums the output
    # gradient's rows into the positions they came from (Tensor._gather_grad)
    "gather": Rule(lambda x, index, fault, arg: x.gather(index, fault, arg), lambda c, g: (
        g._gather_grad(c.inputs[1], c.arg, c.inputs[0].shape[c.arg.axis]), None, None)),
    "copy": Rule(lambda x, arg: x.copy_to(arg), lambda c, g: (g.to(c.inputs[0].device),)),
    # a value whose derivatives are given: inputs (value, x1, d value/d x1, x2, ...), so an op
    # computes its value by any formula and still gets the derivative PyTorch defines
    "given_grad": Rule(lambda value, *rest, arg=None: value, lambda c, g: (None,) + tuple(
        grad for d in c.inputs[2::2] for grad in (_times(g, d), None))),
    # a value whose gradients a function gives: inputs (value, x1, x2, ...), arg(g) returns the
    # gradients of x1, x2, ... (a convolution's input gradient is a transposed convolution,
    # where the gradients of its windows would sum nine shifted copies of a 9x larger tensor)
    "given_vjp": Rule(lambda value, *rest, arg=None: value,
                      lambda c, g: (None,) + tuple(c.arg(g))),
}


def _times(g, x):
    """g * x: the product primitive at once where they are of one dtype and shape (as a
    gradient and its op's operands mostly are), else through the operator's promotion and
    broadcasting."""
    dtype = g.lazy.dtype
    if dtype is x.lazy.dtype and dtype.kind == "float" and g.lazy.shape == x.lazy.shape:
        return g._prim("mul", x)
    return g * x


def _moved(g, name: str, arg: Any, shape: tuple[int, ...]):
    """g moved back by primitive `name` to the input's `shape` (g itself where it has that
    shape, with every axis in place): the forward op checked the argument, so the rule skips
    the Tensor method's parsing and checks (with `_times`, an eager MLP step's backward took
    0.41 ms of CPU instead of 0.56)."""
    if g.shape == shape and (name != "permute" or arg == tuple(range(len(arg)))):
        return g
    return g._prim(name, arg=arg)


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

class _State(threading.local):
    """Per thread, as PyTorch's: one thread's no_grad() must not change what another records.
    Class defaults, so that a thread that never set one reads it without the AttributeError a
    getattr default costs (every op of a step asks `grad_enabled`)."""

    enabled = True
    losses: list | None = None


_state = _State()

# what backward() leaves in `_ctx` of the tensors it walked: their graph is gone
FREED = Context("freed", (), None, None)


def note_loss(loss: Lazy) -> None:
    """Remembers (in this thread) a scalar that backward() ran from: the next optimizer step
    computes it in the same schedule as the updates (`take_losses`)."""
    losses = _state.losses
    if losses is None:
        losses = _state.losses = []
    losses.append(weakref.ref(loss))


def take_losses() -> list[Lazy]:
    """The scalars `note_loss` remembered since the last call that are still unrealized."""
    losses, _state.losses = _state.losses or [], []
    return [lazy for ref in losses if (lazy := ref()) is not None and not lazy.realized]


def grad_enabled() -> bool:
    """False inside `no_grad()` (in this thread): ops then record nothing for backward."""
    return _state.enabled


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
        sources=lambda t: [p for p in t._ctx.inputs if p.requires_grad][::-1])
    order = found.order
    # a freed node stops the walk, so it is among the stopped ones: its gradient would go
    # nowhere (PyTorch raises too)
    if any(t._ctx is FREED for t in found.stopped):
        raise RuntimeError("backward() through a graph that an earlier backward() freed; "
                           "compute the result again")
    grads = {id(root): grad}
    leaves: dict[int, tuple[Any, list]] = {}      # a leaf's gradient terms, in arrival order
    for t in reversed(order):
        g = grads.pop(id(t), None)
        if g is None:
            continue
        ctx = t._ctx
        for parent, pg in zip(ctx.inputs, GRADIENTS[ctx.name].backward(ctx, g)):
            if pg is None or not parent.requires_grad:
                continue
            if parent._ctx is None:
                leaves.setdefault(id(parent), (parent, []))[1].append(pg)
            else:
                grads[id(parent)] = pg if id(parent) not in grads else grads[id(parent)] + pg
        t._ctx = FREED
    for leaf, terms in leaves.values():
        for term in _contractions_joined(terms):
            leaf.grad = term if leaf.grad is None else leaf.grad + term


def _contractions_joined(terms: list) -> list:
    """`terms` (Tensors, one gradient's), with those that are the same contraction of
    different operands over their leading axis made one contraction of the operands joined
    along it: a weight a recurrence reads at every step gets the product of all the steps'
    gradients and inputs, sum_t dy_t.T @ x_t = cat(dy).T @ cat(x), one matmul deep in the
    steps, not one shallow matmul per step and a sum of their outputs. The sum runs over the
    same terms in another order."""
    groups: dict[tuple, list] = {}
    for term in terms:
        groups.setdefault(_contraction_key(term.lazy) or (id(term),), []).append(term)
    return [group[0] if len(group) == 1 else _joined(group) for group in groups.values()]


def _contraction_key(lazy: Lazy) -> tuple | None:
    """What must agree for terms to be joined: a view of a sum over one axis of a product of
    two views, each reading its operand's leading axis along the summed one (and only
    there: its other axes step within a row); None for any other term."""
    if lazy.op is not graph.GraphOp.VIEW or lazy.src[0].op is not graph.GraphOp.REDUCE:
        return None
    total = lazy.src[0]
    op, axes = total.arg
    product = total.src[0]
    if op is not Op.ADD or len(axes) != 1 or product.op is not Op.MUL:
        return None
    key: list = [lazy.arg, lazy.shape, total.arg, product.dtype, lazy.device]
    for side in product.src:
        if side.op is not graph.GraphOp.VIEW or len(side.arg.views) != 1:
            return None
        view, operand = side.arg.views[0], side.src[0]
        row = math.prod(operand.shape[1:])
        if (not operand.shape or view.mask is not None or view.offset
                or view.shape[axes[0]] != operand.shape[0] or view.strides[axes[0]] != row or any(
                    step >= row for k, step in enumerate(view.strides) if k != axes[0])):
            return None
        key += [view, operand.shape, operand.dtype]
    return tuple(key)


def _joined(terms: list) -> Any:
    """The one contraction of `terms` (of one `_contraction_key`) over their operands joined
    along the leading axis."""
    first = terms[0].lazy
    total = first.src[0]
    axis = total.arg[1][0]
    sides = []
    for k, side in enumerate(total.src[0].src):
        joined = _stacked([t.lazy.src[0].src[0].src[k].src[0] for t in terms])
        view = side.arg.views[0]
        shape = tuple(s * len(terms) if a == axis else s for a, s in enumerate(view.shape))
        tracker = type(side.arg)((view._replace(shape=shape),))
        sides.append(graph.Lazy(graph.GraphOp.VIEW, side.dtype, shape, (joined,), tracker,
                                side.device))
    product = sides[0].alu(Op.MUL, sides[1])
    summed = product.reduce(total.arg[0], total.arg[1])
    return type(terms[0])(graph.Lazy(graph.GraphOp.VIEW, first.dtype, first.shape, (summed,),
                                     first.arg, first.device))


def _stacked(pieces: list[Lazy]) -> Lazy:
    """`pieces` (of one shape) joined along their leading axis, as Tensor.cat joins: each
    padded to the whole length, the padded pieces summed as a balanced tree."""
    rows, total = pieces[0].shape[0], pieces[0].shape[0] * len(pieces)
    rest = [(0, 0)] * (len(pieces[0].shape) - 1)
    padded = [p.view("pad", ((k * rows, total - (k + 1) * rows), *rest))
              for k, p in enumerate(pieces)]

    def summed(part: list[Lazy]) -> Lazy:      # halves, as tensor.movement._join sums them
        half = (len(part) + 1) // 2
        return part[0] if len(part) == 1 else summed(part[:half]).alu(Op.ADD, summed(part[half:]))
    return summed(padded)
