"""ONNX's own single-node tests (shipped inside the onnx wheel) on a portkit backend.

    python -m portkit.onnx.node_tests [--device cpu] [-k PATTERN] [--markdown FILE]

Each test is one node with inputs and expected outputs; a test counts when every input and
output is a tensor of a dtype portkit has. Results are per test: passed, failed (wrong values),
error (an exception while running), or unsupported (rejected at load, with the reason).
"""
from __future__ import annotations

import argparse
import warnings
from collections import Counter
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from portkit.abi import dtypes
from portkit.abi.errors import PortkitError

_STANDARD = {np.dtype(d.np) for d in dtypes.ALL}
# what a node test's run may raise; the test then counts as an error
_RUN_ERRORS = (PortkitError, ValueError, TypeError, IndexError, NotImplementedError, KeyError,
               AssertionError, RuntimeError, ArithmeticError)


@dataclass
class Result:
    """One node test's outcome; `detail` says why it did not pass."""

    name: str
    op: str
    status: str          # passed, failed, error, unsupported
    detail: str = ""


def standard_cases(pattern: str | None = None) -> list:
    """The node tests whose inputs and outputs are all arrays of portkit's dtypes."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [c for c in cases if c.kind == "node" and (pattern is None or pattern in c.name)
            and all(isinstance(v, np.ndarray) and v.dtype in _STANDARD
                    for data in c.data_sets for values in data for v in values)]


def op_under_test(name: str) -> str:
    """The op a test is named after: test_layer_normalization_2d_expanded -> LayerNormalization
    (an _expanded test runs the op's function body, so its graph does not show the op)."""
    import onnx

    ops = {s.name.lower(): s.name for s in onnx.defs.get_all_schemas_with_history()}
    parts = name.removeprefix("test_").split("_")
    for end in range(len(parts), 0, -1):
        if "".join(parts[:end]) in ops:
            return ops["".join(parts[:end])]
    return parts[0]


def op_of(case) -> str:
    """The op a test case is about: by its name, or else (test_nesterov_momentum,
    test_sce_mean) the op of its graph's last node."""
    import onnx

    op = op_under_test(case.name)
    known = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    nodes = case.model.graph.node
    return op if op in known or not nodes else nodes[-1].op_type


def category(op: str) -> str:
    """The portkit.onnx module that maps `op`, or "unmapped"."""
    from portkit.onnx import MODULES

    return next((m.__name__.rsplit(".", 1)[1] for m in MODULES if op in m.OPS), "unmapped")


def run_case(case, device: str) -> Result:
    """Loads and runs one node test on `device`, comparing with its expected outputs."""
    from portkit.onnx import UnsupportedModel, load

    op = op_of(case)
    try:
        model = load(case.model, device=device)
    except UnsupportedModel as error:
        return Result(case.name, op, "unsupported", str(error).split(": ", 1)[-1].split(".")[0])
    rtol, atol = max(case.rtol, 1e-5), max(case.atol, 1e-6)
    for inputs, expected in case.data_sets:
        try:
            with np.errstate(all="ignore"):
                got = list(model(*inputs).values())
        except _RUN_ERRORS as error:
            return Result(case.name, op, "error", f"{type(error).__name__}: {error}"[:200])
        for want, value in zip(expected, got):
            value = np.asarray(value)
            if value.shape != want.shape:
                return Result(case.name, op, "failed", f"shape {value.shape}, want {want.shape}")
            if not np.allclose(value.astype(np.float64), want.astype(np.float64), rtol, atol,
                               equal_nan=True):
                return Result(case.name, op, "failed", _error(value, want))
    return Result(case.name, op, "passed")


def compile_ahead(cases: list, device: str) -> int:
    """Builds the graphs of `cases` without running them and compiles all their kernels in
    batches (Runtime.compile_all): one compiler process for many cases, where each case's own
    realize would start one of its own. Returns how many kernels it handed over. A case that
    cannot be built this way (unsupported, values read back while building) is left to its run."""
    from portkit import runtime, schedule
    from portkit.onnx import load
    from portkit.tensor import Tensor

    kernels = []
    for case in cases:
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                model = load(case.model, device=device)
                for inputs, _ in case.data_sets:
                    env = model.run(model.bind(tuple(inputs), {}))
                    outs = [env[n].lazy for n in model.outputs if isinstance(env[n], Tensor)]
                    kernels += schedule.kernels(outs)
        except _RUN_ERRORS:       # the case's own run reports what went wrong
            continue
    unique = list({kernel.to_json(): kernel for kernel in kernels}.values())
    runtime.get(device).compile_all(unique)
    return len(unique)


def _error(value: np.ndarray, want: np.ndarray) -> str:
    """The largest error, and for a half-precision output how many units in the last place
    of the expected value it is (1 or 2: a rounding difference, not a wrong formula)."""
    error = np.abs(value.astype(np.float64) - want.astype(np.float64))
    worst = np.nanmax(error)
    text = f"max abs error {worst:.3g}"
    if want.dtype.kind == "f" and want.dtype.itemsize == 2 or want.dtype.name == "bfloat16":
        expected = abs(float(want.reshape(-1)[np.nanargmax(error)]))
        if expected > 0:
            ulp = 2.0 ** np.floor(np.log2(expected)) * float(ml_dtypes.finfo(want.dtype).eps)
            text += f" ({worst / ulp:.3g} ulp of {want.dtype.name})"
    return text


def run(device: str = "cpu", pattern: str | None = None, progress: bool = True
        ) -> list[Result]:
    """Every standard-dtype node test on `device`."""
    cases = standard_cases(pattern)
    compile_ahead(cases, device)
    iterator = track(cases, description=f"ONNX node tests on {device}") if progress else cases
    return [run_case(case, device) for case in iterator]


def summary(results: list[Result]) -> Table:
    """Counts per status, and the pass rate."""
    counts = Counter(r.status for r in results)
    table = Table("status", "tests", title=f"{len(results)} ONNX node tests: "
                  f"{counts['passed'] / max(len(results), 1):.1%} passed")
    for status in ("passed", "failed", "error", "unsupported"):
        table.add_row(status, str(counts[status]))
    return table


def markdown(results: list[Result], device: str) -> str:
    """The pass rate, a row per op, and each test that did not pass with its reason."""
    counts = Counter(r.status for r in results)
    rate = counts["passed"] / max(len(results), 1)
    lines = [(f"{len(results)} standard-dtype node tests on `{device}`: "
              f"**{counts['passed']} passed ({rate:.1%})**, {counts['failed']} failed, "
              f"{counts['error']} errors, {counts['unsupported']} unsupported."), "",
             "| category (module of portkit/onnx) | tests | passed | rate |", "|---|---|---|---|"]
    by_category: dict[str, list[Result]] = {}
    for result in results:
        by_category.setdefault(category(result.op), []).append(result)
    for name, group in sorted(by_category.items()):
        passed = sum(r.status == "passed" for r in group)
        lines.append(f"| {name} | {len(group)} | {passed} | {passed / len(group):.1%} |")
    lines += ["", "| op | tests | passed | not passed, and why (first one) |", "|---|---|---|---|"]
    by_op: dict[str, list[Result]] = {}
    for result in results:
        by_op.setdefault(result.op, []).append(result)
    for op, group in sorted(by_op.items()):
        bad = [r for r in group if r.status != "passed"]
        why = f"{len(bad)} {bad[0].status}: {bad[0].detail}" if bad else ""
        lines.append(f"| {op} | {len(group)} | {len(group) - len(bad)} | "
                     f"{why.replace('|', '/')} |")
    lines += ["", "| test | status | why |", "|---|---|---|"]
    lines += [f"| {r.name} | {r.status} | {r.detail.replace('|', '/')} |"
              for r in results if r.status != "passed"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("-k", dest="pattern", help="only tests whose name contains PATTERN")
    parser.add_argument("--markdown", help="write the results as Markdown here")
    args = parser.parse_args()
    results = run(args.device, args.pattern)
    Console().print(summary(results))
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(markdown(results, args.device))


if __name__ == "__main__":
    main()
