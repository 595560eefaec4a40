"""portkit.jit: run the kernels a function launched again, without running its Python.

    @portkit.jit
    def step(x, y, lr):
        opt.lr = lr
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss

The first calls run the function eagerly while recording every launch it makes: the program,
its buffers and its scalar arguments. Once two calls in a row launched the same kernels with
the same buffers and numbers, later calls replay that list: new input buffers, new numbers,
the launches, and no graph building, autograd, scheduling, lowering or cache look-up. Copies
between devices (`.to()`) are replayed too, in order, so a step across several devices (a
data-parallel step) is captured whole.

A replay takes afresh:
- the buffers of its Tensor arguments (of the captured shapes, dtypes and devices);
- its float arguments, and numbers computed from them with + - * / // % ** (they reach the
  kernels as scalar arguments); `Live` attributes, such as an optimizer's `lr` and Adam's
  step count, read and set as the function does;
- the tensors the function `assign`s (an optimizer's parameters and state): a replay reads
  their buffers when it starts and gives them their new values when it ends.
Everything else is as it was captured: tensors the function reads without taking them as
arguments (a model's frozen weights, a closure's constants) and every other number, including
what `math` functions (math.cos, math.exp, ...) make of a float argument: they read a float's
value without asking it, so nothing can trace or refuse them; compute such numbers outside the
function and pass them in as float arguments. int, bool,
str and None arguments are static: another value raises JitError. A replay returns new Tensors
without autograd history (call backward inside the function).

JitError refuses what a replay cannot redo: another shape, dtype or device; reading values
back to the host inside the function (.numpy(), .item()); a float argument that compares
otherwise than it did at capture (the comparisons of traced numbers are noted and checked); a
float argument turned into a plain number by float(), int(), round(), math.floor, math.ceil or
math.trunc (a replay could not recompute it); and two capture calls that launched different
kernels or different numbers (Python control flow on values, random ops, a counter the
function keeps in Python).
"""
from __future__ import annotations

import functools
import operator
import sys
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from portkit import graph, runtime, schedule
from portkit.abi.dtypes import DType
from portkit.abi.errors import PortkitError
from portkit.graph import Lazy
from portkit.schedule import replay
from portkit.schedule.replay import ARGS, KEPT, MADE, STATE, Queue, Step
from portkit.tensor.core import Tensor, realize, wrap

if TYPE_CHECKING:
    from typing import Self



class JitError(PortkitError, RuntimeError):
    """A call that portkit.jit cannot capture or replay; the message names the fix."""


# -- numbers a replay recomputes --------------------------------------------------------------


_float = float.__float__    # a Number's value as a plain float, without the checks below


class Number(graph.Traced):
    """A float that came from an argument or a Live attribute, or was computed from those with
    Python arithmetic; `compute(numbers)` gives its value at a replay whose float arguments
    are `numbers` (each call hands its own, so threads replaying at once do not mix them)."""

    __slots__ = ("compute",)
    compute: Callable[[list[float]], float]

    def __new__(cls, value: float, compute: Callable[[list[float]], float]) -> Self:
        number = super().__new__(cls, value)
        number.compute = compute
        return number


def _value(x: Any) -> Any:
    return _float(x) if isinstance(x, Number) else x


def _now(x: Any, numbers: list[float]) -> Any:
    return x.compute(numbers) if isinstance(x, Number) else x


def _traced(op: Callable, reflected: bool = False) -> Callable:
    def method(self: Number, other: Any) -> Any:
        if not isinstance(other, int | float):
            return NotImplemented       # a Tensor operand: Tensor's reflected operator runs
        a, b = (other, self) if reflected else (self, other)
        return Number(op(_value(a), _value(b)),
                      lambda numbers: op(_now(a, numbers), _now(b, numbers)))
    return method


def _traced_unary(op: Callable) -> Callable:
    def method(self: Number) -> Number:
        return Number(op(_float(self)), lambda numbers: op(self.compute(numbers)))
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"):
    _op = getattr(operator, _name)
    setattr(Number, f"__{_name}__", _traced(_op))
    setattr(Number, f"__r{_name}__", _traced(_op, reflected=True))
for _name in ("neg", "pos", "abs"):
    setattr(Number, f"__{_name}__", _traced_unary(getattr(operator, _name)))


def _guarded(op: Callable) -> Callable:
    # A comparison decides which ops the function builds (`x ** s` is a sqrt where s == 0.5):
    # the capture notes its outcome, and a replay whose numbers decide otherwise is refused.
    def method(self: Number, other: Any = None) -> Any:
        if not isinstance(other, int | float | None):
            return NotImplemented
        result = op(_float(self), _value(other))
        capture = schedule.recording()
        if capture is not None:
            capture.guards.append((self, op, other, result))
        return result
    return method


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Number, f"__{_name}__", _guarded(getattr(operator, _name)))
Number.__bool__ = _guarded(lambda value, _: bool(value))
Number.__hash__ = float.__hash__


def _untraceable(name: str) -> Callable:
    # float(s), int(s), round(s), math.floor(s): Python's conversions give a plain number, which
    # a capture would keep as it was; refused inside a capture rather than replayed stale.
    plain = getattr(float, name)

    def method(self: Number, *args: Any) -> Any:
        capture = schedule.recording()
        if capture is not None:
            spelled = {"__float__": "float", "__int__": "int", "__index__": "operator.index"}
            raise JitError(
                f"{capture.name} converts a float argument with "
                f"{spelled.get(name, name.strip('_'))}() inside portkit.jit: the result is a "
                "plain Python number, which a replay would not recompute. Compute with + - * / "
                "// % ** on the float itself (or with Tensor ops), or pass the converted value "
                "as the argument")
        return plain(self, *args)
    return method


for _name in ("__float__", "__int__", "__round__", "__trunc__", "__floor__", "__ceil__"):
    setattr(Number, _name, _untraceable(_name))


class Live:
    """An attribute holding a number that a replay of portkit.jit reads afresh (and sets, where
    the function sets it): `lr = Live()` on an optimizer lets a schedule change the rate of a
    jitted training step."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:
            value = obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(f"{type(obj).__name__} has no {self.name!r} yet") from None
        capture = schedule.recording()
        if capture is None or isinstance(value, Number | bool):
            return value
        return capture.live(obj, self.name, value)

    def __set__(self, obj: Any, value: Any) -> None:
        capture = schedule.recording()
        if capture is not None:
            capture.live_set(obj, self.name, value)
        obj.__dict__[self.name] = value


def _plain(value: Any, kind: type) -> Any:
    value = _value(value)
    return int(value) if kind is int and isinstance(value, float) else value


# -- recording --------------------------------------------------------------------------------


@dataclass
class Plan:
    """What one capture call launched, as steps of the replay engine (schedule/replay.py):
    every buffer named by where a replay finds it (ARGS: the Tensor arguments, STATE: the
    assigned tensors' entry buffers, MADE: earlier steps', KEPT: buffers kept as captured)."""

    steps: list[Step]
    kept: list[runtime.Buffer]              # read as captured (closure tensors, uploads)
    uploads: list[bytes]                    # what the function uploaded, to compare calls
    state: list[Tensor]                     # tensors the function assigns
    reads: list[int]                        # the state tensors whose entry buffers it reads
    state_out: list[tuple[int, int]]        # where each state tensor's new buffer comes from
    state_args: list[int | None]            # the argument a state tensor is, if it is one
    template: Any                           # the result, its tensors replaced by positions
    outputs: list[tuple[tuple[int, int], DType, tuple, str]]
    sets: list[tuple[Any, str, Any, type]] = field(default_factory=list)
    guards: list[tuple[Number, Callable, Any, bool]] = field(default_factory=list)
    queue: Queue = field(default_factory=Queue)     # the steps as one batch, once replayed
    blocks: list[runtime.Buffer] = field(default_factory=list)  # the memory owned outputs lie in

    def check(self, name: str, numbers: list[float]) -> None:
        """JitError if this call's numbers compare otherwise than the captured ones did."""
        for number, op, other, result in self.guards:
            if op(number.compute(numbers), _now(other, numbers)) != result:
                raise JitError(
                    f"{name} compared a float argument with {other!r} while it was captured "
                    f"(an op that treats some values specially, like x ** 0.5), and this "
                    f"call's value {number.compute(numbers)!r} compares otherwise, so the captured "
                    "kernels would be wrong; call the eager function for such values, or keep "
                    "the number fixed in the function")

    def prepare(self) -> None:
        """Readies the plan for replays: a launch whose output no result or state tensor
        keeps writes into memory the plan owns, the same at every replay, shared with the
        outputs dead by then (`replay.prepare_owned`), and every buffer and number that does
        not change between replays is filled in once."""
        outlive = {k for kind, k in self.state_out + [o[0] for o in self.outputs]
                   if kind == MADE}
        self.blocks = replay.prepare_owned(self.steps, outlive, self.kept)

    def key(self) -> tuple:
        """What must be equal between two capture calls for their launches to be the same."""
        steps = tuple((id(s.compiled), s.copy_from, s.sources, tuple(
            None if slot in {t[0] for t in s.traced} else repr(v)
            for slot, v in enumerate(s.fixed))) for s in self.steps)
        kept_ids = tuple(id(b) for b in self.kept[len(self.uploads):])
        state = tuple(id(t) if k is None else ("argument", k)
                      for t, k in zip(self.state, self.state_args))
        return (steps, kept_ids, tuple(self.uploads), state,
                tuple(self.reads), tuple(self.state_out), repr(self.template),
                tuple(o[0] for o in self.outputs), tuple((id(o), n) for o, n, _, _ in self.sets),
                tuple(result for _, _, _, result in self.guards))


class _Capture:
    """The recorder the scheduler reports to while the function runs eagerly."""

    def __init__(self, name: str, arguments: list[Tensor]):
        self.name = name
        self.arguments = arguments
        self.entry = [t.lazy.buffer for t in arguments]     # their buffers as the call began
        self.launches: list[tuple] = []
        self.uploads: list[runtime.Buffer] = []
        self.assigned: dict[int, tuple[Tensor, Lazy]] = {}
        self.leaves: dict[tuple[int, str], Number] = {}
        self.sets: dict[tuple[int, str], tuple[Any, str, Any, type]] = {}
        self.guards: list[tuple[Number, Callable, Any, bool]] = []

    # what the scheduler and Tensor report

    def launch(self, device: str, compiled: runtime.Compiled, buffers: list,
               scalars: list[Lazy], code: list[Lazy]) -> None:
        if any(isinstance(n.arg, Number) for n in code):
            raise JitError(
                f"{self.name}: kernel {compiled.kernel.name!r} holds more than "
                f"{schedule.MAX_SCALARS} distinct numbers from arguments, so some are written "
                "into its code and a replay could not change them; realize part of the "
                "computation earlier (.realize()) so that each kernel holds fewer numbers")
        # the values now: a VAR that is a view's offset reads its node, which a later kernel
        # of the capture may realize (its VIEW then a LOAD, with no offset to read)
        self.launches.append((runtime.get(device), compiled, buffers, scalars,
                              schedule.scalar_values(scalars), None))

    def upload(self, buffer: runtime.Buffer) -> None:
        self.uploads.append(buffer)

    def copy(self, destination: runtime.Runtime, source: runtime.Runtime,
             out: runtime.Buffer, buffer: runtime.Buffer) -> None:
        self.launches.append((destination, None, [out, buffer], [], (), source))

    def host_read(self, tensor: Tensor) -> None:
        raise JitError(f"{self.name} reads a tensor of shape {tensor.shape} back to the host "
                       "(.numpy(), .item(), .tolist(), print) inside portkit.jit, and a replay "
                       "runs only the kernels, so the value would not change; return the tensor "
                       "and read it after the call")

    def assign(self, tensor: Tensor) -> None:
        self.assigned.setdefault(id(tensor), (tensor, tensor.lazy))

    def live(self, obj: Any, name: str, value: Any) -> Number:
        """The Number a Live attribute reads as inside the capture."""
        leaf = self.leaves.get((id(obj), name))
        if leaf is None:
            leaf = self.leaves[id(obj), name] = Number(
                value, lambda numbers: _float(float(obj.__dict__[name])))
        return leaf

    def live_set(self, obj: Any, name: str, value: Any) -> None:
        kind = self.sets.get((id(obj), name), (None, None, None, None))[3]
        kind = kind or type(_value(obj.__dict__.get(name, value)))
        self.sets[id(obj), name] = (obj, name, value, kind)

    def restore(self) -> None:
        """Leaves plain numbers (not Numbers) in the Live attributes the function set."""
        for obj, name, value, kind in self.sets.values():
            obj.__dict__[name] = _plain(value, kind)

    # the plan

    def plan(self, result: Any) -> Plan:
        where: dict[int, tuple[int, int]] = {}
        for k, buffer in enumerate(self.entry):
            where.setdefault(id(buffer), (ARGS, k))
        state = [tensor for tensor, _ in self.assigned.values()]
        reads = []
        for k, (_, lazy) in enumerate(self.assigned.values()):
            if lazy.realized and id(lazy.buffer) not in where:
                where[id(lazy.buffer)] = (STATE, len(reads))
                reads.append(k)
        # the function's own uploads come first among the buffers kept as captured
        kept = [b for b in self.uploads if id(b) not in where]
        uploads = [b.numpy().tobytes() for b in kept]
        where.update((id(b), (KEPT, k)) for k, b in enumerate(kept))

        def source(buffer: runtime.Buffer) -> tuple[int, int]:
            found = where.get(id(buffer))
            if found is None:
                found = where[id(buffer)] = (KEPT, len(kept))
                kept.append(buffer)
            return found

        steps = []
        for k, (rt, compiled, buffers, scalars, values, copy_from) in enumerate(self.launches):
            out = buffers[0]
            traced = tuple((slot, node.arg.compute, node.dtype)
                           for slot, node in enumerate(scalars) if isinstance(node.arg, Number))
            steps.append(Step(rt, compiled, out.dtype, out.size,
                              tuple(source(b) for b in buffers[1:]),
                              values, traced, copy_from=copy_from))
            where[id(out)] = (MADE, k)
        tensors: list[Tensor] = []
        template = _template(result, tensors, self.name)
        outputs = [(source(t.lazy.buffer), t.dtype, t.shape, t.device) for t in tensors]
        state_out = [source(t.lazy.buffer) for t in state]
        state_args = [next((k for k, a in enumerate(self.arguments) if a is t), None)
                      for t in state]
        return Plan(steps, kept, uploads, state, reads, state_out, state_args, template, outputs,
                    list(self.sets.values()), self.guards)


def _template(result: Any, tensors: list[Tensor], name: str) -> Any:
    """`result` with each Tensor replaced by its position in `tensors` (appended to)."""
    if isinstance(result, Tensor):
        tensors.append(result)
        return len(tensors) - 1
    if isinstance(result, tuple | list):
        return type(result)(_template(r, tensors, name) for r in result)
    if result is None:
        return None
    raise JitError(f"{name} returns a {type(result).__name__}, which a replay cannot give "
                   "again; return Tensors (or a tuple or list of them, or None)")


def _fill(template: Any, tensors: list[Tensor]) -> Any:
    if isinstance(template, int):
        return tensors[template]
    if isinstance(template, tuple | list):
        return type(template)(_fill(t, tensors) for t in template)
    return None


# -- the decorator ----------------------------------------------------------------------------

_STATIC = (int, bool, str, type(None))


def _signature(values: tuple, name: str
               ) -> tuple[tuple, list[Tensor], list[float], list[Tensor]]:
    """What a call's arguments must match, its Tensor arguments, its float arguments and the
    Tensor arguments not yet realized."""
    signature, tensors, numbers, pending = [], [], [], []
    load = graph.GraphOp.LOAD       # not the `realized` property: a call fewer per argument
    for position, value in enumerate(values):
        if isinstance(value, Tensor):
            lazy = value.lazy       # the dtype by name: compared in C, a DType in Python
            signature.append((lazy.shape, lazy.dtype.name, lazy.device))
            tensors.append(value)
            if lazy.op is not load:
                pending.append(value)
        elif type(value) is float or isinstance(value, Number):
            signature.append(float)
            numbers.append(float(value))
        elif isinstance(value, _STATIC):
            signature.append((type(value), value))
        else:
            raise JitError(f"argument {position} of {name} is a {type(value).__name__}; a "
                           "jitted function takes Tensors, floats (read again at every call) "
                           "and ints, bools, strings or None (fixed at capture)")
    return tuple(signature), tensors, numbers, pending


def _describe(entry: Any) -> str:
    if entry is float:
        return "a float"
    if isinstance(entry[0], tuple):
        shape, dtype, device = entry
        return f"a {dtype} tensor of shape {shape} on {device}"
    return repr(entry[1])


_jits: weakref.WeakSet[Jit] = weakref.WeakSet()    # every Jit, for runtime.clear()


def _forget_plans() -> None:
    for found in list(_jits):
        found.forget()


runtime.on_clear(_forget_plans)


class Jit:
    """A function whose launches are captured once and then replayed (see the module's
    docstring); made by `portkit.jit(fn)`."""

    CAPTURES = 3    # capture calls at most before two in a row must agree

    def __init__(self, fn: Callable):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature: tuple | None = None
        self.plan: Plan | None = None
        self.previous: Plan | None = None
        self.captures = 0
        # A plan's steps write buffers the plan owns (results no caller keeps), the same at
        # every replay: two threads' replays would write each other's, so they take turns.
        self._replaying = threading.Lock()
        _jits.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        values = args + tuple(kwargs[k] for k in sorted(kwargs)) if kwargs else args
        signature, tensors, numbers, pending = _signature(values, self.name)
        if signature != self.signature:
            if self.signature is not None:
                raise JitError(self._mismatch(signature))
            self.signature = signature
        if schedule.recording() is not None:    # inside another capture: part of it
            return self.fn(*args, **kwargs)
        if pending:
            realize(*pending)
        if self.plan is not None:
            return self._replay(self.plan, tensors, numbers)
        return self._capture(args, kwargs, tensors, numbers)

    def _mismatch(self, signature: tuple) -> str:
        if len(signature) != len(self.signature):
            change = f"{len(signature)} arguments instead of {len(self.signature)}"
        else:
            k = next(k for k, (a, b) in enumerate(zip(signature, self.signature)) if a != b)
            change = (f"argument {k} is {_describe(signature[k])} instead of "
                      f"{_describe(self.signature[k])}")
        return (f"{self.name} was captured by portkit.jit for other arguments: {change}. A "
                "replay runs kernels made for the captured shapes, dtypes, devices and fixed "
                "values; make one portkit.jit(fn) per kind of input, or pad the input to the "
                "captured shape")

    def _capture(self, args: tuple, kwargs: dict, tensors: list[Tensor],
                 numbers: list[float]) -> Any:
        self.captures += 1
        leaves = iter([Number(v, operator.itemgetter(k)) for k, v in enumerate(numbers)])
        traced = [next(leaves) if type(a) is float or isinstance(a, Number) else a
                  for a in args]
        traced_kwargs = {k: kwargs[k] for k in sorted(kwargs)}
        for k, v in traced_kwargs.items():
            if type(v) is float or isinstance(v, Number):
                traced_kwargs[k] = next(leaves)
        capture = _Capture(self.name, tensors)
        with schedule.record(capture):
            try:
                result = self.fn(*traced, **traced_kwargs)
                outputs: list[Tensor] = []
                _template(result, outputs, self.name)
                realize(*outputs, *(t for t, _ in capture.assigned.values()))
            finally:
                capture.restore()
        plan = capture.plan(result)
        if self.previous is not None and plan.key() == self.previous.key():
            plan.prepare()
            self.plan, self.previous = plan, None
        elif self.captures >= self.CAPTURES:
            problem = _difference(self.previous, plan)
            self.previous = plan
            raise JitError(f"{self.name}: calls {self.captures - 1} and {self.captures} under "
                           f"portkit.jit did not launch the same work: {problem}")
        else:
            self.previous = plan
        return result

    def forget(self) -> None:
        """Drops the captured plan: the next call captures again (runtime.clear() calls it,
        since a plan holds compiled programs and buffers)."""
        self.plan = self.previous = None
        self.captures = 0

    def _replay(self, plan: Plan, tensors: list[Tensor], numbers: list[float]) -> Any:
        if plan.guards:
            plan.check(self.name, numbers)
        targets = state = plan.state
        if state:
            targets = [t if k is None else tensors[k]
                       for t, k in zip(plan.state, plan.state_args)]
            state = [targets[k] for k in plan.reads]
            pending = [t for t in state if not t.lazy.realized]
            if pending:
                realize(*pending)
        args, entry = [t.lazy.buffer for t in tensors], [t.lazy.buffer for t in state]
        with self._replaying:
            made = replay.run(plan.steps, (args, entry, None, plan.kept), numbers,
                              queue=plan.queue)
        tables: tuple[list, ...] = (args, entry, made, plan.kept)
        if plan.sets:
            values = [(obj, name, _plain(_now(value, numbers), kind))
                      for obj, name, value, kind in plan.sets]
            for obj, name, value in values:
                obj.__dict__[name] = value
        for tensor, (kind, k) in zip(targets, plan.state_out):
            tensor.lazy = graph.load(tables[kind][k], tensor.dtype, tensor.shape, tensor.device)
        return _fill(plan.template, [wrap(graph.load(tables[kind][k], dtype, shape, device))
                                     for (kind, k), dtype, shape, device in plan.outputs])


def _difference(before: Plan, after: Plan) -> str:
    """The first difference between the launches of two capture calls, and its likely cause."""
    control = ("the function's work depends on its data or on Python state (an `if` on a "
               "value, a loop count, a new tensor per call); jit only the part that does the "
               "same work every call")
    if len(before.steps) != len(after.steps):
        # where they part: the first launch that differs, and what each call ran there
        names = [[_step_name(s) for s in plan.steps] for plan in (before, after)]
        k = next((k for k, (a, b) in enumerate(zip(*names)) if a != b), min(map(len, names)))
        ran = [", ".join(n[k:k + 3]) + (", ..." if len(n) > k + 3 else "") or "nothing"
               for n in names]
        last = ", ".join(names[0][max(0, k - 2):k]) or "none"
        return (f"{len(before.steps)} kernels, then {len(after.steps)}, parting at launch {k} "
                f"(after {last}): {ran[0]} / {ran[1]}: {control}")
    for k, (a, b) in enumerate(zip(before.steps, after.steps)):
        if (a.compiled is not b.compiled or a.copy_from is not b.copy_from
                or a.sources != b.sources):
            return (f"launch {k} ran {_step_name(a)!r}, then {_step_name(b)!r} or on other "
                    f"buffers: {control}")
        traced = {slot for slot, _, _ in a.traced + b.traced}
        for slot, (x, y) in enumerate(zip(a.fixed, b.fixed)):
            if slot not in traced and repr(x) != repr(y):
                return (f"kernel {_step_name(a)!r} (launch {k}) got the number {x!r}, "
                        f"then {y!r}. A number that changes per call must be a float argument "
                        "of the jitted function (or a Live attribute, like an optimizer's lr) "
                        "to be read again at a replay; random ops inside need their random "
                        "tensors passed in as arguments")
    if before.uploads != after.uploads:
        return ("it uploaded other data (Tensor(array) inside the function); pass that data "
                "in as a Tensor argument")
    return f"it read or updated other tensors, or returned others: {control}"


def _step_name(step: Step) -> str:
    """A step's kernel name, or what a copy between devices does."""
    if step.compiled is None:
        return f"copy {step.copy_from.name if step.copy_from else ''} -> {step.runtime.name}"
    return step.compiled.kernel.name


def jit(fn: Callable) -> Jit:
    """Captures the launches of `fn` over its first calls, then replays them on later calls
    with new Tensor and float arguments (see portkit/jit.py for what a replay re-reads)."""
    return Jit(fn)


class _CallableModule(types.ModuleType):
    """This module, callable: `portkit.jit(fn)` is `portkit.jit.jit(fn)`, whether `portkit.jit`
    names the module (once anything imported it) or the function."""

    def __call__(self, fn: Callable) -> Jit:
        return jit(fn)


sys.modules[__name__].__class__ = _CallableModule
