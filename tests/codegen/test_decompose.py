"""Every rewrite in portkit.codegen.decompose, run in the interpreter and judged by the spec."""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from portkit.abi import Kernel, KernelBuilder, dtypes, spec
from portkit.abi.dtypes import DType
from portkit.abi.interpreter import run
from portkit.abi.ops import DOMAIN, OPTIONAL, REQUIRED, TERNARY, UNARY, Op
from portkit.codegen.decompose import DECOMPOSITIONS, SIN_ACCURATE_TO, decompose


def elementwise(op: Op, dtype: DType, n: int) -> Kernel:
    """out[i] = op(in0[i], in1[i], ...), one workgroup per element."""
    b = KernelBuilder(f"{op.name.lower()}_{dtype.name}")
    arity = 1 if op in UNARY else 3 if op in TERNARY else 2
    inputs = [b.param(dtype) for _ in range(arity)]
    out = b.param(dtype)
    i = b.special("group", 0)
    b.store(out, i, b.alu(op, *(b.load(p, i) for p in inputs)))
    return b.build(grid=(n, 1, 1))


def edges(dtype: DType) -> np.ndarray:
    """±0, ±inf, NaN, subnormals, the extremes: the values a rewrite most easily gets wrong."""
    if dtype.is_int:
        values = [0, 1, 2, dtype.min, dtype.max, dtype.min + 1, dtype.max - 1]
        values += [-1, -2] if dtype.kind == "int" else []
        return np.array(values, dtype.np)
    import ml_dtypes

    info = ml_dtypes.finfo(dtype.np)
    values = [0.0, np.inf, np.nan, float(info.smallest_subnormal), float(info.smallest_normal),
              float(info.smallest_normal) - float(info.smallest_subnormal), float(info.max),
              1.0, 0.5, 1.5, 2.5, 3.0, 0.75, float(info.eps), 1 - float(info.epsneg)]
    values += [-v for v in values]
    return np.array(values, np.float64).astype(dtype.np)


def random_bits(rng: np.random.Generator, dtype: DType, n: int) -> np.ndarray:
    """Uniform over bit patterns: every exponent, sign, NaN and subnormal shows up."""
    raw = rng.integers(0, 2 ** dtype.bits, n, dtype=np.uint64, endpoint=False)
    return raw.astype(f"u{dtype.itemsize}").view(dtype.np)


def interesting(rng: np.random.Generator, op: Op, dtype: DType, n: int) -> np.ndarray:
    """Values where the op's result is neither trivial nor overflowed."""
    if op is Op.EXP2:
        import ml_dtypes

        info = ml_dtypes.finfo(dtype.np)
        low, high = np.log2(float(info.smallest_subnormal)) - 2, np.log2(float(info.max)) + 2
        return rng.uniform(low, high, n).astype(dtype.np)
    if op is Op.SIN:
        bound = min(SIN_ACCURATE_TO[dtype.name], spec.SIN_RANGE, float(dtype.max))
        near = rng.uniform(-8, 8, n // 2)
        return np.concatenate([near, rng.uniform(-bound, bound, n - n // 2)]).astype(dtype.np)
    return rng.uniform(-4, 4, n).astype(dtype.np)


def inputs(op: Op, dtype: DType, rng: np.random.Generator) -> list[np.ndarray]:
    """Edge values crossed with each other, then random values, one array per operand."""
    arity = 1 if op in UNARY else 3 if op in TERNARY else 2
    edge = edges(dtype)
    if arity == 3:   # the full cube of edges is large; pair each edge with a few others
        edge = edge[::2]
    crossed = [np.array(c, dtype.np) for c in zip(*itertools.product(edge, repeat=arity))]
    n = 2000 if dtype != dtypes.float64 or op is not Op.MULACC else 200
    if dtype.is_int:
        randoms = [rng.integers(dtype.min, dtype.max, n, endpoint=True, dtype=dtype.np)
                   for _ in range(arity)]
    else:
        randoms = [np.concatenate([random_bits(rng, dtype, n), interesting(rng, op, dtype, n)])
                   for _ in range(arity)]
    args = [np.concatenate([c, r]) for c, r in zip(crossed, randoms)]
    if op is Op.MULACC and dtype == dtypes.float64:
        # The spec's exact float64 oracle raises OverflowError when a finite a*b+c overflows
        # (reported to the ABI's owner); leave those inputs out until it returns inf there.
        with np.errstate(all="ignore"):
            keep = ~np.isfinite(args[0]) | ~np.isfinite(args[1]) | ~np.isfinite(args[2]) | (
                np.abs(args[0]) * np.abs(args[1]) + np.abs(args[2]) < dtype.max / 2)
        args = [a[keep] for a in args]
    return args


def run_kernel(kernel: Kernel, args: list[np.ndarray]) -> np.ndarray:
    out = np.zeros(args[0].size, args[0].dtype)
    run(kernel, [a.copy() for a in args] + [out])
    return out


CASES = [(op, dtype) for op in sorted(OPTIONAL, key=lambda o: o.name) for dtype in DOMAIN[op]]


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o.name}-{d.name}" for o, d in CASES])
def test_rewrite_meets_the_spec(op: Op, dtype: DType) -> None:
    args = inputs(op, dtype, np.random.default_rng(zlib.crc32(f"{op.name}-{dtype.name}".encode())))
    original = elementwise(op, dtype, args[0].size)
    rewritten = decompose(original, native=frozenset())
    assert not {n.op for n in rewritten.nodes} & OPTIONAL, "an optional op survived"
    actual = run_kernel(rewritten, args)
    mask = spec.valid(op, *args)
    if op is Op.SIN:   # the documented range of the rewrite; the rest is tested below
        with np.errstate(invalid="ignore"):
            mask &= ~(np.abs(args[0].astype(np.float64)) > SIN_ACCURATE_TO[dtype.name])
    ok, err = spec.within_budget(op, dtype, actual, spec.evaluate(op, *args), mask)
    worst = int(np.argmax(np.where(ok, -1.0, err)))
    assert ok.all(), (f"{(~ok).sum()} of {ok.size} outside {spec.budget(op, dtype)} ULP; e.g. "
                      f"{op.name}{tuple(a[worst] for a in args)} = {actual[worst]}, spec says "
                      f"{spec.evaluate(op, *(a[worst:worst + 1] for a in args))[0][0]}")
    # The interpreter runs the original op through the same spec: both must agree with it.
    assert spec.within_budget(op, dtype, run_kernel(original, args),
                              spec.evaluate(op, *args), mask)[0].all()


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16])
def test_sin_meets_its_budget_on_every_finite_float32(dtype: DType) -> None:
    # beyond the spec's range (the rewrite promises more): magnitudes log-uniform up to the
    # largest float, floats next to multiples of pi/2 and pi, both signs
    rng = np.random.default_rng(5)
    x = np.concatenate([
        10.0 ** rng.uniform(4, 38.5, 3000) * rng.choice([-1.0, 1.0], 3000),
        rng.integers(-2 ** 40, 2 ** 40, 1500) * (np.pi / 2),
        rng.integers(-2 ** 31, 2 ** 31, 1500) * np.pi,
        [1e6, 1e7, 1e10, 1e20, 3e38, -3e38, 2.0 ** 20, 16367173 * 2.0 ** 72]])
    with np.errstate(over="ignore"):
        x = x.astype(dtype.np)
    x = x[np.isfinite(x.astype(np.float32))]
    out = run_kernel(decompose(elementwise(Op.SIN, dtype, x.size), native=frozenset()), [x])
    ok, err = spec.within_budget(Op.SIN, dtype, out, spec.evaluate(Op.SIN, x))
    worst = int(np.argmax(err))
    assert ok.all(), (f"{(~ok).sum()} of {x.size} outside {spec.budget(Op.SIN, dtype)} ULP; "
                      f"worst sin({x[worst]!r}) = {out[worst]}, numpy {np.sin(float(x[worst]))}")
    if dtype == dtypes.float32:   # the reduction is exact to 2^-59 of a quadrant: 2 ulp at most
        assert err.max() <= 2, err.max()
    assert SIN_ACCURATE_TO[dtype.name] == float(dtype.max)


def test_float64_sin_beyond_its_range_is_finite_and_in_range_and_nan_only_for_inf_and_nan(
        ) -> None:
    big = [2.0 ** 31, -(2.0 ** 40), 1e300, 1.7e308]
    x = np.array(big + [np.inf, -np.inf, np.nan], np.float64)
    rewritten = decompose(elementwise(Op.SIN, dtypes.float64, x.size), native=frozenset())
    out = run_kernel(rewritten, [x])
    assert (np.abs(out[:len(big)]) <= 1).all(), out
    assert np.isnan(out[len(big):]).all(), out


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16, dtypes.float16])
def test_sin_of_inf_and_nan_is_nan(dtype: DType) -> None:
    x = np.array([np.inf, -np.inf, np.nan], np.float64).astype(dtype.np)
    out = run_kernel(decompose(elementwise(Op.SIN, dtype, x.size), native=frozenset()), [x])
    assert np.isnan(out.astype(np.float32)).all(), out


def test_trunc_keeps_the_sign_of_zero() -> None:
    x = np.array([-0.0, -0.5, -0.9999, 0.25], np.float32)
    out = run_kernel(decompose(elementwise(Op.TRUNC, dtypes.float32, 4), frozenset()), [x])
    assert list(np.signbit(out)) == [True, True, True, False]


def test_native_ops_are_left_alone() -> None:
    kernel = elementwise(Op.SIN, dtypes.float32, 4)
    assert decompose(kernel, native=frozenset(OPTIONAL)) is kernel
    assert decompose(kernel, native=frozenset({Op.SIN})) is kernel


def test_rewrites_apply_until_only_native_ops_remain() -> None:
    kernel = elementwise(Op.SUB, dtypes.int32, 4)
    with_neg = {n.op for n in decompose(kernel, native=frozenset({Op.NEG})).nodes}
    assert Op.NEG in with_neg and Op.SUB not in with_neg
    without = {n.op for n in decompose(kernel, native=frozenset()).nodes}
    assert not without & {Op.NEG, Op.SUB} and Op.MUL in without


def test_required_ops_cannot_be_decomposed() -> None:
    assert set(DECOMPOSITIONS) == OPTIONAL and not set(DECOMPOSITIONS) & REQUIRED
    # A device that claims no ops at all still gets required ops: they are assumed native.
    kernel = elementwise(Op.ADD, dtypes.float32, 4)
    assert decompose(kernel, native=frozenset()) is kernel


def test_loops_branches_and_registers_stay_well_formed() -> None:
    # acc = 0; for j in [0, n): if x[j] < 1: acc = max(acc, exp2(x[j]) - 1); out[0] = acc
    b = KernelBuilder("scoped")
    x, out = b.param(dtypes.float32), b.param(dtypes.float32)
    zero, one = b.const(0.0, dtypes.float32), b.const(1.0, dtypes.float32)
    acc = b.acc(zero)
    with b.loop(b.const(0), b.var("n")) as j:
        value = b.load(x, j)
        with b.branch(b.alu(Op.CMPLT, value, one)):
            b.assign(acc, b.alu(Op.MAX, acc, b.alu(Op.SUB, b.alu(Op.EXP2, value), one)))
    b.store(out, b.const(0), acc)
    kernel = b.build()
    rewritten = decompose(kernel, native=frozenset())
    values = np.array([-3.0, 0.5, 0.75, 2.0, 0.25], np.float32)
    results = []
    for k in (kernel, rewritten):
        buffers = [values.copy(), np.zeros(1, np.float32)]
        run(k, buffers, scalars=(values.size,))
        results.append(buffers[1][0])
    assert results[1] == pytest.approx(results[0], rel=1e-6)
    assert results[0] == pytest.approx(2 ** 0.75 - 1, rel=1e-6)
    # The JSON form holds the rewrite's NaN and inf constants exactly.
    assert Kernel.from_json(rewritten.to_json()).to_json() == rewritten.to_json()
