"""Tier 4, Tensor ops forward and backward, through the whole stack, on the backend.

Each op runs on the backend as portkit.Tensor code (forward, then `.backward()` of
sum(out * w) for a random w), and is judged against float64 numpy: the forward, and the
vector-Jacobian product w^T J for each float input. Bounds (docs/conformance.md):
- exact: movement, integer results, selections (max, relu, pooling by max);
- one ABI op (sqrt, add, ...): that op's ULP budget from portkit.abi.spec;
- anything longer: (U * eps + gamma_n) * M per element, where U sums (ULP budget + 1) over the
  rounding ABI ops of the kernels that compute it (read from the stack's own schedule), n is
  the longest sum, and M the magnitude of the terms (the computation on absolute values, times
  the growth of an argument's error through exp).
A failing case also runs on the CPU reference, to say whether the fault is the backend's.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from portkit.abi import PortkitError, dtypes, spec
from portkit.abi.errors import UnsupportedDType
from portkit.abi.ops import Op
from portkit.conformance.case import (
    Case,
    Check,
    Context,
    Outcome,
    Status,
    TierNotRun,
    Unsupported,
    judge,
)
from portkit.conformance.tensor_ops import EXACT, OPS, TensorOp, gamma
from portkit.conformance.tier1_runtime import ESSENTIAL
from portkit.conformance.tier3_kernels import ops_used

TIER = 4
NAME = "tensor"
# ABI ops that round their result; the others (MAX, WHERE, NEG, ...) are exact selections.
ROUNDING = (Op.ADD, Op.SUB, Op.MUL, Op.FDIV, Op.RECIP, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN,
            Op.MULACC, Op.CAST)
@dataclass
class Ran:
    """What one run of a TensorOp on one device produced."""

    out: np.ndarray
    grads: list[np.ndarray] = field(default_factory=list)
    units: tuple[float, float] = (0.0, 0.0)     # U of the forward and of the gradients
    kernels: tuple[list, list] = ([], [])         # ABI kernels, forward and backward (planned)


# -- running an op on a device ------------------------------------------------------------------


def stack_device(target: Any) -> str:
    """The device name under which the Tensor stack reaches `target`'s Runtime.

    A backend loaded by name is already there; a Device handed in directly (a test's broken
    backend, say) is registered under "<name>.conform" (numbered if that name is taken).
    """
    from portkit import runtime

    for k in itertools.count(-1):
        name = target.name if k < 0 else f"{target.name}.conform{k or ''}"
        try:
            if runtime.get(name).device is target.device:
                return name
        except PortkitError:
            if k >= 0:
                runtime.register(runtime.Runtime(name, target.device))
                return name
    raise AssertionError("unreachable")


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16


def machine_eps(dtype: dtypes.DType) -> float:
    """The distance from 1 to the next float of `dtype`."""
    return float(ml_dtypes.finfo(dtype.np).eps)


def case_inputs(op: TensorOp, dtype: dtypes.DType, rng: np.random.Generator
                ) -> tuple[list[np.ndarray], list[bool]]:
    """The inputs in the case's dtype (floats; integers stay int32) and which are floats."""
    raw = op.inputs(rng)
    is_float = [x.dtype.kind == "f" for x in raw]
    return [x.astype(dtype.np) if f or dtype.is_int else x
            for x, f in zip(raw, is_float)], is_float


def rounding_units(kernels: list) -> float:
    """U: the sum of (ULP budget + 1) over the rounding float ops of `kernels` (each distinct
    kernel once: the schedules of several results repeat the kernels they share)."""
    total = 0.0
    for kernel in {k.to_json(): k for k in kernels}.values():
        for node in kernel.nodes:
            if node.op in ROUNDING and node.dtype is not None and node.dtype.is_float:
                total += spec.budget(node.op, node.dtype) + 1
    return total


def run_op(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray], is_float: list[bool],
           w: np.ndarray | None, device: str, plan: bool = False) -> Ran:
    """Runs `op` on `device`: the forward and, with `w`, the gradients of sum(out * w).

    With `plan`, nothing runs: the result holds U and `kernels`, the ABI kernels it would use.
    The forward and the gradients realize in one schedule (`kernels_ahead` lists its kernels).
    """
    from portkit.tensor import realize

    out, wanted = _graphs(op, inputs, is_float, w, device)
    if plan:
        forward = out.schedule()
        backward = [k for g in wanted for k in g.schedule()]
        return Ran(np.zeros(0), units=(rounding_units(forward), rounding_units(backward)),
                   kernels=(forward, backward))
    realize(out, *wanted)
    return Ran(out.numpy(), [g.numpy() for g in wanted])


def kernels_ahead(op: TensorOp, inputs: list[np.ndarray], is_float: list[bool],
                  w: np.ndarray | None, device: str) -> list:
    """The ABI kernels `run_op` compiles on `device` (nothing runs), to compile ahead."""
    from portkit import schedule

    out, wanted = _graphs(op, inputs, is_float, w, device)
    return schedule.kernels([out.lazy, *[g.lazy for g in wanted]])


def _graphs(op: TensorOp, inputs: list[np.ndarray], is_float: list[bool],
            w: np.ndarray | None, device: str) -> tuple[Any, list]:
    """The op's output on `device` and, with `w`, the gradients of sum(out * w), unrealized."""
    from portkit.tensor import Tensor

    grads = w is not None
    tensors = [Tensor(x, device=device, requires_grad=grads and f)
               for x, f in zip(inputs, is_float)]
    out = op.run(*tensors)
    if not grads:
        return out, []
    (out * Tensor(w.astype(out.dtype.np), device=device)).sum().backward()
    return out, [t.grad for t, f in zip(tensors, is_float) if f]


# -- judging --------------------------------------------------------------------------------


def _judge(label: str, actual: np.ndarray, check: Check) -> Any:
    verdict = judge(check, actual.reshape(-1), [])
    if not verdict.ok:
        index = verdict.worst["index"]
        where = list(np.unravel_index(index, actual.shape)) if actual.ndim else []
        verdict.message = f"{label}: " + verdict.message.replace(
            f"buffer 0[{index}]", f"{label}{where}")
    return verdict


def _bound_check(expected: np.ndarray, rule: tuple[np.ndarray, int], units: float,
                 dtype: dtypes.DType) -> Check:
    magnitude, n = rule
    eps = machine_eps(dtype)
    bound = (units * eps + gamma(n, eps)) * np.broadcast_to(magnitude, expected.shape)
    return Check(0, "bound", (expected.reshape(-1),), expected.size,
                 bound=np.asarray(bound, np.float64).reshape(-1))


def _exact_check(expected: np.ndarray, dtype: np.dtype) -> Check:
    expected = np.asarray(expected).astype(dtype)
    return Check(0, "exact", (expected.reshape(-1),), expected.size)


def forward_checks(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray], ran: Ran,
                   units: float) -> list[tuple[str, np.ndarray, Check]]:
    """(label, actual, check) for the forward output."""
    wide = [x.astype(np.float64) if _is_float(x) else x for x in inputs]
    if isinstance(op.check, Op):
        if op.check is Op.MAX or op.check is Op.NEG:
            return [("out", ran.out, _exact_check(op.forward(*wide), ran.out.dtype))]
        args = np.broadcast_arrays(*inputs)
        expected = spec.evaluate(op.check, *args)
        check = Check(0, "op", tuple(e.reshape(-1) for e in expected), ran.out.size,
                      op=op.check.name, dtype=dtype.name,
                      mask=np.asarray(spec.valid(op.check, *args)).reshape(-1))
        return [("out", ran.out, check)]
    expected = np.asarray(op.forward(*wide))
    if op.check == EXACT or not _is_float(ran.out):
        return [("out", ran.out, _exact_check(expected, ran.out.dtype))]
    return [("out", ran.out, _bound_check(expected, op.check(*wide), units, dtype))]


def backward_checks(op: TensorOp, dtype: dtypes.DType, inputs: list[np.ndarray],
                    is_float: list[bool], w: np.ndarray, ran: Ran, units: float
                    ) -> list[tuple[str, np.ndarray, Check]]:
    """(label, actual, check) for the gradient of each float input."""
    wide = [x.astype(np.float64) if f else x for x, f in zip(inputs, is_float)]
    w = w.astype(dtype.np).astype(np.float64)
    expected = op.vjp(w, *wide)
    rules = op.grad_check(w, *wide) if op.grad_check != EXACT else [None] * len(expected)
    labels = [f"grad x{k}" for k, f in enumerate(is_float) if f]
    found = []
    for label, actual, e, rule in zip(labels, ran.grads, expected, rules):
        e = np.broadcast_to(e, actual.shape)
        check = (_exact_check(e, actual.dtype) if rule is None
                 else _bound_check(e, rule, units, dtype))
        found.append((label, actual, check))
    return found


# -- cases ----------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the stack will run for one (op, dtype), found before the run: the tier 2 and 3
    cases it depends on, and U forward and backward."""

    requires: tuple[tuple[str, ...], tuple[str, ...]]
    units: tuple[float, float]
    error: str = ""


def oracle_shape(op: TensorOp, inputs: list[np.ndarray]) -> tuple[int, ...]:
    """The shape of the op's output (and so of the w its gradient is weighted by)."""
    return np.shape(op.forward(*[x.astype(np.float64) if x.dtype.kind == "f" else x
                                 for x in inputs]))


def _plan(ctx: Context, op: TensorOp, dtype: dtypes.DType, device: str) -> _Plan:
    """Builds the op's graph on the interpreter (nothing runs) to read its kernels."""
    inputs, is_float, w = case_data(ctx, op, dtype)
    try:
        ran = run_op(op, dtype, inputs, is_float, w, device, plan=True)
    except Exception as error:  # noqa: BLE001 - reported by the case when it runs
        return _Plan((ESSENTIAL, ESSENTIAL), (0.0, 0.0), f"{type(error).__name__}: {error}")
    forward, backward = ran.kernels
    return _Plan((_requires(forward), _requires(forward + backward)), ran.units)


def _requires(kernels: list) -> tuple[str, ...]:
    """Tier 1's essentials, the tier 2 case of every (op, dtype) the kernels use, and tier 3's
    workgroup-memory cases where they use LOCAL."""
    needs = [case_id for kernel in kernels for case_id in ops_used(kernel)]
    if any(n.op is Op.LOCAL for kernel in kernels for n in kernel.nodes):
        needs.append("kernels/local/*")
    return ESSENTIAL + tuple(dict.fromkeys(needs))


def differentiable(op: TensorOp, dtype: dtypes.DType) -> bool:
    """Whether the op has a backward case in `dtype` (a VJP, and float inputs)."""
    return op.vjp is not None and dtype.is_float


def _outcome(verdicts: list) -> Outcome:
    failed = [v for v in verdicts if not v.ok]
    ulps = [v.error for v in verdicts if v.unit == "ulp"]
    errors = [v.error for v in verdicts if v.unit != "ulp"]
    return Outcome(Status.FAILED if failed else Status.PASSED,
                   "; ".join(v.message for v in failed), max(ulps) if ulps else None,
                   max(errors) if errors else None, failed[0].worst if failed else None)


def case_data(ctx: Context, op: TensorOp, dtype: dtypes.DType
              ) -> tuple[list[np.ndarray], list[bool], np.ndarray | None]:
    """The case's inputs, which are floats, and the w its gradient is weighted by (None where
    the op has no backward in `dtype`): the same for every run of the case."""
    rng = ctx.rng(f"tensor/{op.name}/{dtype.name}")
    inputs, is_float = case_inputs(op, dtype, rng)
    w = rng.standard_normal(oracle_shape(op, inputs)) if differentiable(op, dtype) else None
    return inputs, is_float, w


def evaluate(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool, plan: _Plan,
             device: str) -> Outcome:
    """Runs one case on `device` and judges it against float64 numpy."""
    inputs, is_float, w = case_data(ctx, op, dtype)
    try:
        ran = run_op(op, dtype, inputs, is_float, w if backward else None, device)
    except UnsupportedDType as why:
        raise Unsupported(str(why)) from None
    if backward:
        checks = backward_checks(op, dtype, inputs, is_float, w, ran, plan.units[1])
    else:
        checks = forward_checks(op, dtype, inputs, ran, plan.units[0])
    return _outcome([_judge(label, actual, check) for label, actual, check in checks])


def _blame(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool, plan: _Plan,
           target_name: str) -> str:
    """Whether the CPU reference passes the same case: says whose fault a failure is."""
    from portkit.conformance.target import Target

    try:
        reference = evaluate(ctx, op, dtype, backward, plan, stack_device(Target.load("cpu")))
    except Exception as error:  # noqa: BLE001 - only context for a failure already found
        return f" (the CPU reference could not run it: {type(error).__name__}: {error})"
    if reference.status is Status.PASSED:
        return f" (the CPU reference passes this case: the fault is {target_name}'s)"
    return (" (the CPU reference fails this case too: the stack or this bound is at fault, "
            "not the backend)")


def _case(ctx: Context, op: TensorOp, dtype: dtypes.DType, backward: bool,
          plan: _Plan) -> Case:
    case_id = f"tensor/{op.name}/{dtype.name}/{'bwd' if backward else 'fwd'}"

    def fn(target: Any) -> Outcome:
        if plan.error:
            return Outcome(Status.FAILED, f"building the graph failed: {plan.error}")
        outcome = evaluate(ctx, op, dtype, backward, plan, stack_device(target))
        if outcome.status is Status.FAILED:
            if target.name != "cpu":
                outcome.message += _blame(ctx, op, dtype, backward, plan, target.name)
            outcome.replay = f"portkit conform --backend {target.name} --tier 4 -k {case_id}"
        return outcome

    def ahead(target: Any) -> tuple[str, list]:
        inputs, is_float, w = case_data(ctx, op, dtype)
        device = stack_device(target)
        return device, kernels_ahead(op, inputs, is_float, w if backward else None, device)

    return Case(case_id, TIER, op.name, dtype.name, plan.requires[backward], fn=fn,
                ahead=None if plan.error else ahead)


def interpreter_target() -> Any:
    """The interpreter as a Target: the registered one, so its device name stays the same."""
    from portkit.conformance.target import Target
    from portkit.reference_backends import interpreter

    try:
        return Target.load("interpreter")
    except PortkitError:    # discovery replaced (a test's fake registry): use it unregistered
        return Target(interpreter.backend.load(), "interpreter")


def cases(ctx: Context) -> list[Case]:
    """Forward and backward cases per op and dtype; `--quick` keeps the marked ops, float32."""
    try:
        planner = stack_device(interpreter_target())
    except ImportError as error:
        raise TierNotRun(f"needs portkit.tensor, which does not import here ({error})") from None
    found = []
    for op in OPS:
        if ctx.quick and not op.quick:
            continue
        for name in op.dtypes[:1] if ctx.quick else op.dtypes:
            dtype = dtypes.by_name(name)
            plan = _plan(ctx, op, dtype, planner)
            found.append(_case(ctx, op, dtype, False, plan))
            if differentiable(op, dtype):
                found.append(_case(ctx, op, dtype, True, plan))
    return found


# conformance/shims reads these by their old private names until it moves to the public ones.
