"""Conformance of matrix units (conformance/matrix_cases.py): a device that runs its declared
units right passes every MMA case, one whose layout is wrong fails them, and one that declares
none is reported unsupported, with the reason."""
from __future__ import annotations

import dataclasses

from portkit import backends
from portkit.abi import Kernel, Op
from portkit.abi.interpreter import run
from portkit.conformance import matrix_cases, suite, tier2_ops, tier3_kernels
from portkit.conformance.case import Context, Status
from portkit.conformance.target import Target
from portkit.reference_backends.interpreter.capabilities import capabilities


class _TransposedB:
    """Runs kernels in the interpreter with every MMA reading B transposed: a renderer that
    got its unit's B layout wrong."""

    def __init__(self, name: str, binary: bytes):
        kernel = Kernel.from_json(binary.decode())
        nodes = []
        for node in kernel.nodes:
            if node.op is Op.MMA:
                unit = node.arg
                wrong = tuple(tuple(rc[::-1] for rc in row) for row in unit.b)
                node = dataclasses.replace(node, arg=dataclasses.replace(unit, b=wrong))
            nodes.append(node)
        self.kernel = dataclasses.replace(kernel, nodes=tuple(nodes))

    def __call__(self, buffers, scalars, grid, block, wait=False):
        typed = [b.view(p.dtype.np) for b, p in zip(buffers, self.kernel.params)]
        run(self.kernel, typed, scalars, grid, block)
        return 0.0 if wait else None


def _outcomes(program=None) -> dict[str, Status]:
    device = backends.load("interpreter")
    device = dataclasses.replace(device, name="interpreter-units",
                                 capabilities=capabilities(matrix_units=True),
                                 program=program or device.program)
    target = Target(device, "interpreter-units")
    ctx = Context(device.capabilities, quick=True)
    cases = matrix_cases.cases(ctx) + matrix_cases.loop_cases(ctx)
    return {case.id: suite.execute(target, case) for case in cases}


def test_declared_units_pass_every_case_and_the_tiers_list_them():
    outcomes = _outcomes()
    assert len(outcomes) == 2 * len(matrix_cases.KINDS) + 2
    assert all(o.status is Status.PASSED for o in outcomes.values()), outcomes
    ctx = Context(capabilities(matrix_units=True), quick=True)
    assert set(outcomes) <= {c.id for c in tier2_ops.cases(ctx) + tier3_kernels.cases(ctx)}


def test_a_wrong_layout_fails_with_the_worst_element():
    outcomes = _outcomes(_TransposedB)
    unit = "m8n8k8_float32_float32"
    for case in (f"ops/MMA/{unit}/random", f"kernels/mma/{unit}"):
        outcome = outcomes[case]
        assert outcome.status is Status.FAILED, case
        assert "elements wrong" in outcome.message and "(bound " in outcome.message
    # ones everywhere do not tell B from its transpose
    assert outcomes[f"ops/MMA/{unit}/precision"].status is Status.PASSED


def test_a_device_without_units_is_unsupported_with_the_reason():
    target = Target(backends.load("interpreter"), "interpreter")
    ctx = Context(capabilities(), quick=True)
    (case,) = [c for c in tier2_ops.cases(ctx) if c.op == "MMA"]
    outcome = suite.execute(target, case)
    assert outcome.status is Status.UNSUPPORTED
    assert "declares no matrix units" in outcome.message
    assert not matrix_cases.loop_cases(ctx)
