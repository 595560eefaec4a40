"""Every ABI op on every dtype a backend declares, against the spec's oracle and budget.

Parametrized by backend (every available one, the interpreter included) and by case; the
cases are conformance's tier 2 (--quick: every op x dtype x edge class, conversions sampled),
so pytest and `portkit conform` check exactly the same thing.
"""
import pytest

from portkit.abi import dtypes
from portkit.abi.ops import COMPUTE, DOMAIN, Op
from portkit.conformance import Options, Status, run, suite, target, tier2_ops
from portkit.conformance.case import Context
from portkit.reference_backends.interpreter.capabilities import (
    capabilities as interpreter_capabilities,
)

BACKENDS = target.available()
# The compute ops' cases; the MMA cases are tests/abi/test_matrix.py's.
CASES = {c.id: c for c in tier2_ops.cases(Context(interpreter_capabilities(), quick=True))
         if c.op != "MMA"}


@pytest.fixture(scope="module")
def prepared():
    """Per backend: its Target and every case's kernel, compiled once, in parallel."""
    cache = {}

    def get(name):
        if name not in cache:
            device = target.Target.load(name)
            made = {case_id: case.make() for case_id, case in CASES.items()}
            device.precompile([kc.kernel for kc in made.values()], jobs=4)
            cache[name] = device, made
        return cache[name]
    return get


def test_every_op_and_dtype_has_a_case():
    ops = {(c.op, c.dtype.split("->")[0]) for c in CASES.values()}
    for op in COMPUTE:
        for dtype in DOMAIN[op]:
            assert (op.name, dtype.name) in ops
    assert "ops/CAST/float32->bool" in CASES and "ops/BITCAST/float32->int32" in CASES


def test_the_interpreter_is_always_among_the_backends():
    assert "interpreter" in BACKENDS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id", list(CASES))
def test_op(prepared, backend, case_id):
    device, made = prepared(backend)
    case = CASES[case_id]
    outcome = suite.execute(device, case, made[case_id])
    declared = {d.name for d in device.capabilities.dtypes}
    if set(case.dtype.split("->")) <= declared:
        assert outcome.status is Status.PASSED, outcome.message
    else:
        assert outcome.status is Status.UNSUPPORTED and "dtypes" in outcome.message


def test_full_conversion_matrix_and_random_sample_on_the_interpreter():
    report = run(target.Target.load("interpreter"), Options(tiers=(2,), quick=False))
    assert len(report.results) > len(CASES)
    assert report.ok, [r.message for r in report.results if r.status is not Status.PASSED]


def test_quick_conversions_cover_every_source_and_target():
    pairs = [c.dtype.split("->") for c in CASES.values() if c.op == Op.CAST.name]
    assert {s for s, _ in pairs} == {t for _, t in pairs} == {d.name for d in dtypes.ALL}
