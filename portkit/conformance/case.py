"""What a conformance case is, how its outputs are judged, and what its result says.

A kernel case is data (kernel, initial buffers, scalars, checks), so a failing one can be written
to a file and replayed anywhere. Checks judge one output buffer each and always name the worst
element: its inputs, the expected and actual values, and the distance between them.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from portkit.abi import Capabilities, dtypes, spec
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op


class Status(str, Enum):
    """The honest outcome of a case."""

    PASSED = "passed"
    FAILED = "failed"
    BLOCKED = "blocked"            # a prerequisite case failed, so this one was not run
    UNSUPPORTED = "unsupported"    # the backend declares it lacks a dtype or feature
    XFAIL = "xfail"                # failed, and listed in the xfail file with a reason
    XPASS = "xpass"                # listed in the xfail file, yet passed: update the list
    CRASHED = "crashed"            # the worker process died running it (a signal, an exit)
    TIMEOUT = "timeout"            # ran past the per-case limit; the worker was killed


# The statuses that make a run fail (its exit code).
FAILING = (Status.FAILED, Status.XPASS, Status.CRASHED, Status.TIMEOUT)
# A prerequisite with one of these statuses blocks the cases that require it.
BLOCKING = (Status.FAILED, Status.BLOCKED, Status.XFAIL, Status.CRASHED, Status.TIMEOUT)
# The statuses whose results carry their evidence: message, kernel, source, replay line.
EVIDENCE = (Status.FAILED, Status.XFAIL, Status.XPASS, Status.CRASHED, Status.TIMEOUT)


class Unsupported(Exception):
    """Raised by a case the backend's declared capabilities rule out; the message says which."""


class TierNotRun(Exception):
    """Raised by a tier's `cases` when the tier cannot run here; the message is the reason."""


class CaseFailed(Exception):
    """Raised by a hand-written case (tiers 1 and 6) with the message of its failure."""


@dataclass
class Check:
    """How one output buffer (PARAM `output`) is judged against the oracle.

    kind "op": within spec's budget for `op` on `dtype` (any of `expected` is acceptable, only
    where `mask`); "exact": equal (NaN equals NaN, -0 equals 0); "bound": |actual - expected|
    <= `bound` per element, the error bound derived from the inputs' length and magnitudes.
    Only the first `count` elements are compared. `operands` are PARAM positions whose
    elements line up with the output's, shown as the inputs of the worst element.
    """

    output: int
    kind: str
    expected: tuple[np.ndarray, ...]
    count: int
    op: str | None = None
    dtype: str | None = None
    mask: np.ndarray | None = None
    bound: np.ndarray | None = None
    operands: tuple[int, ...] = ()
    labels: list[str] | None = None


@dataclass
class KernelCase:
    """A kernel, its buffers before the launch (one per PARAM), scalars and output checks."""

    kernel: Kernel
    inputs: list[np.ndarray]
    checks: list[Check]
    scalars: tuple[int, ...] = ()


@dataclass
class Verdict:
    """The judgement of one check."""

    ok: bool
    error: float                  # worst error: ULPs for "op" on floats, else absolute
    unit: str                     # "ulp", "abs" or "mismatch"
    message: str = ""
    worst: dict[str, Any] | None = None


def judge(check: Check, actual: np.ndarray, inputs: list[np.ndarray]) -> Verdict:
    """Compares `actual` (the output buffer after the run) with the check's oracle."""
    n = check.count
    actual = actual[:n]
    expected = tuple(e[:n] for e in check.expected)
    mask = check.mask[:n] if check.mask is not None else np.ones(n, bool)
    unit = "abs"
    with np.errstate(all="ignore"):
        if check.kind == "op":
            op, dtype = Op[check.op], dtypes.by_name(check.dtype)
            ok, err = spec.within_budget(op, dtype, actual, expected, mask)
            unit = "ulp" if dtype.is_float else "mismatch"
        elif check.kind == "exact":
            a, e = actual, expected[0]
            ok = (a == e) | (_isnan(a) & _isnan(e))
            err = np.where(ok, 0.0, 1.0)
            unit = "mismatch"
        elif check.kind == "bound":
            a, e = actual.astype(np.float64), expected[0].astype(np.float64)
            err = np.abs(a - e)
            ok = (err <= check.bound[:n]) | (a == e) | (np.isnan(a) & np.isnan(e))
            err = np.where(np.isnan(err) & ~ok, np.inf, np.where(ok & np.isnan(err), 0.0, err))
        else:
            raise ValueError(f"unknown check kind {check.kind!r}")
        ok = ok | ~mask
        err = np.where(mask, err, 0.0)
    worst_error = float(err.max()) if n else 0.0
    if ok.all():
        return Verdict(True, worst_error, unit)
    failing = ~ok
    index = int(np.argmax(np.where(failing, np.nan_to_num(err, posinf=1e308) + 1, -1)))
    worst = {
        "output": check.output, "index": index,
        "inputs": {f"in{p}": _scalar(inputs[p][index]) for p in check.operands},
        "expected": _scalar(expected[0][index]), "actual": _scalar(actual[index]),
        "error": float(err[index]), "unit": unit,
    }
    if check.labels:
        worst["edge_class"] = check.labels[index]
    where = f"buffer {check.output}[{index}]"
    if check.labels:
        where += f" ({check.labels[index]})"
    args = ", ".join(f"{k}={v!r}" for k, v in worst["inputs"].items())
    distance = {"ulp": f"{_num(worst['error'])} ULP", "mismatch": "mismatch",
                "abs": f"|error| {_num(worst['error'])}"}[unit]
    if check.kind == "op" and unit == "ulp":
        distance += f" (budget {_num(spec.budget(Op[check.op], dtypes.by_name(check.dtype)))})"
    if check.kind == "bound":
        distance += f" (bound {_num(float(check.bound[index]))})"
    message = (f"{int(failing.sum())} of {n} elements wrong; worst at {where}: "
               + (f"inputs {args}, " if args else "")
               + f"expected {worst['expected']!r}, actual {worst['actual']!r}, {distance}")
    return Verdict(False, worst_error, unit, message, worst)


def _isnan(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "biu":
        return np.zeros(x.shape, bool)
    return np.isnan(x.astype(np.float64))


def _scalar(value: Any) -> Any:
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    return float(value)


def _num(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


@dataclass
class Outcome:
    """What running a case produced (before xfail and blocking are applied)."""

    status: Status
    message: str = ""
    max_ulp: float | None = None
    max_error: float | None = None
    worst: dict[str, Any] | None = None
    repro: KernelCase | None = None
    source: str | None = None
    perf: dict[str, Any] | None = None
    replay: str | None = None     # a command that reruns this case (cases without a repro)


@dataclass
class Case:
    """One named check of a backend. `requires` holds case-id patterns (fnmatch) that must
    pass first; `make` builds a kernel case, or `fn(target)` runs a hand-written one.
    `ahead(target)`, where given, says what `fn` will compile without running anything: the
    stack's device name and the ABI kernels, compiled with the rest of the tier's in batches."""

    id: str
    tier: int
    op: str | None = None
    dtype: str | None = None
    requires: tuple[str, ...] = ()
    make: Callable[[], KernelCase] | None = None
    fn: Callable[[Any], Outcome] | None = None
    ahead: Callable[[Any], tuple[str, list]] | None = None


@dataclass
class Result:
    """A case's final status and evidence, as reported."""

    case: Case
    status: Status
    message: str = ""
    max_ulp: float | None = None
    max_error: float | None = None
    seconds: float = 0.0
    worst: dict[str, Any] | None = None
    source: str | None = None
    repro_path: str | None = None
    replay: str | None = None
    kernel_json: str | None = None
    perf: dict[str, Any] | None = None


@dataclass
class Context:
    """What tiers build their cases from: the run's options and the declared capabilities."""

    capabilities: Capabilities
    quick: bool = False
    seed: int = 0
    reference: Any = None                # Target of the CPU reference backend, for tier 6
    perf_min_ratio: float | None = None

    def rng(self, case_id: str) -> np.random.Generator:
        """A generator that depends only on the seed and the case, not on what else runs."""
        return np.random.default_rng([self.seed, zlib.crc32(case_id.encode())])
