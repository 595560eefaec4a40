"""The CPU reference backend: every op on every dtype against the spec, hand-written kernels
against the interpreter, and the compiler's failure modes."""
from __future__ import annotations

import numpy as np
import pytest

from portkit.abi import BackendUnavailable, CompileError, KernelBuilder, Op, dtypes, spec
from portkit.abi.dtypes import DType
from portkit.abi.interpreter import run as interpret
from portkit.abi.ops import BINARY, DOMAIN, UNARY
from portkit.codegen.cstyle import function_name
from portkit.conformance.generate import edge_values, random_values
from portkit.reference_backends import cpu
from portkit.reference_backends.cpu import runtime

N, BLOCK = 1024, 128


def load_with(compiler: str | None, cache_dir) -> object:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PORTKIT_CACHE", str(cache_dir))
        if compiler:
            patch.setenv("PORTKIT_CC", compiler)
        else:
            patch.delenv("PORTKIT_CC", raising=False)
        return cpu.backend.load()


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    """The default device: clang here."""
    return load_with(None, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def gcc_device(tmp_path_factory):
    """gcc takes other liberties than clang (it would fuse a*b + c unless told not to)."""
    return load_with("gcc", tmp_path_factory.mktemp("cache"))


def launch(device, kernel, arrays, scalars=()):
    """Runs `kernel` on copies of `arrays` (one per PARAM); returns them after the run."""
    arrays = [np.array(a) for a in arrays]
    binary = device.compiler.compile(device.renderer.render(kernel))
    program = device.program(kernel.name, binary)
    program([a.view(np.uint8) for a in arrays], list(scalars), kernel.grid, kernel.block)
    return arrays


def check_against_interpreter(device, kernel, arrays, scalars=()):
    ours = launch(device, kernel, arrays, scalars)
    theirs = [np.array(a) for a in arrays]
    interpret(kernel, theirs, scalars)
    for position, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_array_equal(a, b, err_msg=f"buffer {position} of {kernel.name}")
    return ours


# ---- every compute op x every dtype, one kernel per source dtype -----------------------------

def operands(dtype: DType, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """a, b crossed over all edge values, then random; c random; s valid shift amounts."""
    edges = np.concatenate(list(edge_values(dtype).values()))
    a, b = (x.ravel() for x in np.meshgrid(edges, edges))
    rest = N - a.size
    a = np.concatenate([a, random_values(dtype, rest, rng)])
    b = np.concatenate([b, random_values(dtype, rest, rng)])
    c = np.concatenate([np.resize(edges, N // 4), random_values(dtype, N - N // 4, rng)])
    shift = (random_values(dtype, N, rng, Op.SHL, 1) if dtype.is_int
             else np.zeros(N, dtype.np))
    return {"a": a, "b": b, "c": c, "s": shift, "cond": rng.integers(0, 2, N).astype(bool)}


def all_ops_kernel(dtype: DType):
    """One kernel computing every op defined on `dtype`, every CAST and BITCAST from it."""
    k = KernelBuilder(f"all_ops_{dtype.name}")
    a, b, c, s = (k.param(dtype) for _ in range(4))
    cond = k.param(dtypes.bool_)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(BLOCK)), k.special("local"))
    x, y, z, amount, flag = (k.load(p, i) for p in (a, b, c, s, cond))
    outputs = []   # (description, op, input names, result dtype)

    def output(node: int, what: tuple) -> None:
        k.store(k.param(k.dtype(node)), i, node)
        outputs.append(what)

    for op in [*UNARY, *BINARY, Op.WHERE, Op.MULACC]:
        if dtype not in DOMAIN[op]:
            continue
        args = {Op.WHERE: ("cond", "a", "b"), Op.MULACC: ("a", "b", "c"),
                Op.SHL: ("a", "s"), Op.SHR: ("a", "s")}.get(op, ("a", "b")[:1 + (op in BINARY)])
        nodes = {"a": x, "b": y, "c": z, "s": amount, "cond": flag}
        node = k.alu(op, *(nodes[name] for name in args))
        output(node, (op, args, k.dtype(node)))
    for target in dtypes.ALL:
        output(k.cast(x, target), (Op.CAST, ("a",), target))
        if target.itemsize == dtype.itemsize and target != dtype:
            output(k.cast(x, target, bitcast=True), (Op.BITCAST, ("a",), target))
    return k.build(grid=(N // BLOCK, 1, 1), block=(BLOCK, 1, 1)), outputs


@pytest.mark.parametrize("compiler", ["device", "gcc_device"])
@pytest.mark.parametrize("dtype", dtypes.ALL, ids=lambda d: d.name)
def test_every_op_matches_the_spec(request, compiler, dtype):
    device = request.getfixturevalue(compiler)
    kernel, outputs = all_ops_kernel(dtype)
    inputs = operands(dtype, np.random.default_rng(0))
    arrays = [inputs[n] for n in ("a", "b", "c", "s", "cond")]
    arrays += [np.zeros(N, result.np) for _, _, result in outputs]
    results = launch(device, kernel, arrays)[5:]
    failures = []
    for (op, names, result), actual in zip(outputs, results):
        args = [inputs[n] for n in names]
        target = result if op in (Op.CAST, Op.BITCAST) else None
        mask = spec.valid(op, *args, dtype=target)
        if op is Op.MULACC and dtype == dtypes.float64:
            # spec's exact float64 fma raises OverflowError where a*b+c overflows: leave
            # those elements out (they are still computed, just not judged).
            with np.errstate(all="ignore"):
                fits = np.abs(args[0] * args[1]) + np.abs(args[2]) < dtype.max / 2
            mask = mask & fits
            args = [np.where(fits, x, 0) for x in args]
        with np.errstate(all="ignore"):   # the oracle's own float64 overflow warnings
            expected = spec.evaluate(op, *args, dtype=target)
            ok, err = spec.within_budget(op, result, actual, expected, mask)
        if not ok.all():
            j = int(np.argmax(~ok))
            failures.append(f"{op.name} -> {result.name}: {int((~ok).sum())} wrong, e.g. "
                            f"inputs {[x[j] for x in args]} gave {actual[j]}, expected "
                            f"{[e[j] for e in expected]} (error {err[j]})")
    assert not failures, f"{dtype.name}:\n" + "\n".join(failures)


# ---- hand-written kernels, compared with the interpreter -------------------------------------

def test_loop_accumulator_and_scalar_arguments(device):
    # out[g] = scale * sum(x[g*n : g*n + n]) + bias, with n, scale, bias int32 scalars
    k = KernelBuilder("row_sums")
    x, out = k.param(dtypes.int32), k.param(dtypes.int32)
    n, scale, bias = k.var("n"), k.var("scale"), k.var("bias")
    g = k.special("group", 0)
    acc = k.acc(k.const(0))
    with k.loop(k.const(0), n) as j:
        k.assign(acc, k.alu(Op.ADD, acc, k.load(x, k.alu(Op.ADD, k.alu(Op.MUL, g, n), j))))
    k.store(out, g, k.alu(Op.ADD, k.alu(Op.MUL, acc, scale), bias))
    kernel = k.build(grid=(6, 1, 1))
    xs = np.arange(30, dtype=np.int32)
    _, out_values = check_against_interpreter(device, kernel, [xs, np.zeros(6, np.int32)],
                                              (5, 3, -1))
    assert out_values.tolist() == [3 * xs[5 * r:5 * r + 5].sum() - 1 for r in range(6)]


def test_conditionals_and_gated_loads_and_stores(device):
    # out[i] = x[i - 1] (0 at i = 0) where i < n; negative results are replaced by 100 in an IF
    k = KernelBuilder("shift_right")
    x, out = k.param(dtypes.float32), k.param(dtypes.float32)
    n = k.var("n")
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(4)), k.special("local", 0))
    previous = k.load(x, k.alu(Op.SUB, i, k.const(1)), k.alu(Op.CMPLT, k.const(0), i))
    inside = k.alu(Op.CMPLT, i, n)
    k.store(out, i, previous, inside)
    with k.branch(k.alu(Op.AND, inside, k.alu(Op.CMPLT, previous, k.const(0.0, dtypes.float32)))):
        k.store(out, i, k.const(100.0, dtypes.float32))
    kernel = k.build(grid=(3, 1, 1), block=(4, 1, 1))
    xs = np.array([1, -2, 3, 4, -5, 6, 7, 8, 9, 10, 11, 12], np.float32)
    _, result = check_against_interpreter(device, kernel, [xs, np.full(12, 7, np.float32)], (10,))
    assert result.tolist() == [0, 1, 100, 3, 4, 100, 6, 7, 8, 9, 7, 7]


def test_multi_axis_grid_and_block(device):
    grid, block = (2, 3, 2), (2, 2, 3)
    k = KernelBuilder("ids")
    out = k.param(dtypes.int32)
    ids = [k.special(kind, axis) for kind in ("group", "local") for axis in range(3)]
    extents = [*grid, *block]
    code, linear, weight = k.const(0), k.const(0), 1
    for node, digit in zip(ids, (1, 10, 100, 1000, 10000, 100000)):
        code = k.alu(Op.ADD, code, k.alu(Op.MUL, node, k.const(digit)))
    for node, extent in zip(ids, extents):   # thread axes innermost, axis 0 fastest
        linear = k.alu(Op.ADD, linear, k.alu(Op.MUL, node, k.const(weight)))
        weight *= extent
    k.store(out, linear, code)
    kernel = k.build(grid=grid, block=block)
    (result,) = check_against_interpreter(device, kernel, [np.full(weight, -1, np.int32)])
    assert len(set(result.tolist())) == weight and -1 not in result


def test_local_memory_reversal_with_a_barrier(device):
    size = 64
    k = KernelBuilder("reverse")
    x, out = k.param(dtypes.bfloat16), k.param(dtypes.bfloat16)
    g, lane = k.special("group", 0), k.special("local", 0)
    tile = k.local(dtypes.bfloat16, size)
    i = k.alu(Op.ADD, k.alu(Op.MUL, g, k.const(size)), lane)
    k.store(tile, lane, k.load(x, i))
    k.barrier()
    k.store(out, i, k.load(tile, k.alu(Op.SUB, k.const(size - 1), lane)))
    kernel = k.build(grid=(5, 1, 1), block=(size, 1, 1))
    xs = np.arange(5 * size).astype(dtypes.bfloat16.np)
    _, result = check_against_interpreter(device, kernel, [xs, np.zeros_like(xs)])
    assert (result.reshape(5, size) == xs.reshape(5, size)[:, ::-1]).all()


def tree_sum_kernel(size: int, groups: int):
    """out[g] = sum of x[g*size : (g+1)*size] by halving in LOCAL memory, a barrier per step."""
    k = KernelBuilder("tree_sum")
    x, out = k.param(dtypes.float32), k.param(dtypes.float32)
    g, lane = k.special("group", 0), k.special("local", 0)
    tile = k.local(dtypes.float32, size)
    k.store(tile, lane, k.load(x, k.alu(Op.ADD, k.alu(Op.MUL, g, k.const(size)), lane)))
    k.barrier()
    with k.loop(k.const(0), k.const(size.bit_length() - 1)) as step:
        stride = k.alu(Op.SHR, k.const(size // 2), step)
        with k.branch(k.alu(Op.CMPLT, lane, stride)):
            other = k.load(tile, k.alu(Op.ADD, lane, stride))
            k.store(tile, lane, k.alu(Op.ADD, k.load(tile, lane), other))
        k.barrier()
    with k.branch(k.alu(Op.CMPLT, lane, k.const(1))):
        k.store(out, g, k.load(tile, k.const(0)))
    return k.build(grid=(groups, 1, 1), block=(size, 1, 1))


def test_tree_reduction_in_local_memory(device):
    kernel = tree_sum_kernel(256, 6)
    xs = np.random.default_rng(1).integers(-50, 50, 256 * 6).astype(np.float32)
    _, result = check_against_interpreter(device, kernel, [xs, np.zeros(6, np.float32)])
    np.testing.assert_array_equal(result, xs.reshape(6, 256).sum(axis=1))


# ---- the compiler ----------------------------------------------------------------------------

def test_device_describes_itself(device):
    caps = device.capabilities
    assert caps.ops == frozenset(spec.SPECS) and caps.dtypes == frozenset(dtypes.ALL)
    assert runtime.cpu_model() in caps.device_name
    assert f"({runtime.threads()} thread" in caps.device_name
    assert runtime.cpu_model() in device.compiler.cache_key
    assert device.compiler.version in device.compiler.cache_key


def test_compile_error_carries_source_and_log(device):
    with pytest.raises(CompileError) as info:
        device.compiler.compile("void pk_launch(void) { this is not C; }")
    assert "this is not C" in info.value.source
    assert "error" in info.value.log


@pytest.mark.parametrize("value", ["/nonexistent", "definitely-not-a-compiler"])
def test_missing_compiler_is_backend_unavailable(monkeypatch, value):
    monkeypatch.setenv("PORTKIT_CC", value)
    with pytest.raises(BackendUnavailable) as info:
        cpu.backend.load()
    assert "no C compiler found" in str(info.value)
    assert "PORTKIT_CC" in info.value.fix and "apt-get install" in info.value.fix


def test_no_compiler_on_path(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTKIT_CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailable, match="no C compiler found"):
        cpu.backend.load()


def test_gcc_builds_barriers_and_16_bit_floats(gcc_device):
    device = gcc_device
    assert device.compiler.command == ["gcc"] and "gcc" in device.compiler.version.lower()
    k = KernelBuilder("half_tree")
    x, out = k.param(dtypes.float16), k.param(dtypes.float32)
    lane = k.special("local", 0)
    tile = k.local(dtypes.float16, 8)
    k.store(tile, lane, k.alu(Op.MUL, k.load(x, lane), k.const(1.5, dtypes.float16)))
    k.barrier()
    k.store(out, lane, k.cast(k.load(tile, k.alu(Op.SUB, k.const(7), lane)), dtypes.float32))
    kernel = k.build(block=(8, 1, 1))
    xs = np.array([1, 2, 3, 65504, -0.0, 6e-8, np.inf, np.nan], np.float16)
    check_against_interpreter(device, kernel, [xs, np.zeros(8, np.float32)])


@pytest.mark.parametrize("source, value, target, expected", [
    # Rounding through float32 first would land on a tie and round down; the exact value is
    # above the midpoint and must round up.
    (dtypes.int32, 2**24 + 2**16 + 1, dtypes.bfloat16, 2**24 + 2**17),
    (dtypes.int64, 2**40 + 2**32 + 1, dtypes.bfloat16, 2**40 + 2**33),
    (dtypes.float64, 1 + 2**-11 + 2**-40, dtypes.float16, 1 + 2**-10),
    (dtypes.float64, 1 + 2**-8 + 2**-40, dtypes.bfloat16, 1 + 2**-7),
    (dtypes.float64, 65519.99, dtypes.float16, 65504.0),
    (dtypes.float64, 65520.0, dtypes.float16, float("inf")),
    (dtypes.float64, 2.0**-25 + 2.0**-60, dtypes.float16, 2.0**-24),   # subnormal, rounds up
    (dtypes.float64, -(2.0**-25), dtypes.float16, -0.0),                 # tie to even: zero
])
def test_casts_to_16_bit_floats_round_once(device, source, value, target, expected):
    k = KernelBuilder("narrow")
    x, out = k.param(source), k.param(target)
    k.store(out, k.const(0), k.cast(k.load(x, k.const(0)), target))
    kernel = k.build()
    _, result = launch(device, kernel, [np.array([value], source.np), np.zeros(1, target.np)])
    assert float(result[0]) == expected
    assert np.signbit(result[0]) == np.signbit(expected)


def test_a_compiler_without_openmp_runs_kernels_on_every_core(monkeypatch, tmp_path):
    # A compiler that rejects -fopenmp, as clang does without libomp installed: the pool is
    # C11 and pthreads, so launches still go to every thread.
    wrapper = tmp_path / "cc-without-openmp"
    wrapper.write_text('#!/bin/sh\ncase "$*" in *-fopenmp*) echo "no libomp" >&2; exit 1;; '
                       'esac\nexec clang "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PORTKIT_CC", str(wrapper))
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    device = cpu.backend.load()
    assert "(2 threads" in device.capabilities.device_name
    check_against_interpreter(device, tree_sum_kernel(16, 3),
                              [np.arange(48, dtype=np.float32), np.zeros(3, np.float32)])


def test_the_allocator_keeps_each_buffers_pointer_until_it_frees_it(device):
    # launches read a buffer's C pointer from here instead of making it anew each time
    allocator, before = device.allocator, dict(runtime._pointers)
    made = [allocator.alloc(64) for _ in range(5)]

    def address(pointer) -> int:
        return int(runtime._ffi.cast("uintptr_t", pointer))
    assert [address(runtime._pointers[id(m)]) for m in made] == [
        address(runtime._ffi.from_buffer(m)) for m in made]
    for m in made:
        allocator.free(m, 64)
    assert runtime._pointers == before


# ---- EXP2 on float: the template's pk_exp2f, not libm -----------------------------------------

def exp2_kernel(dtype: DType, n: int):
    k = KernelBuilder(f"exp2_{dtype.name}")
    x, out = k.param(dtype), k.param(dtype)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(BLOCK)), k.special("local"))
    k.store(out, i, k.alu(Op.EXP2, k.load(x, i)))
    return k.build(grid=(n // BLOCK, 1, 1), block=(BLOCK, 1, 1))


@pytest.mark.parametrize("dtype, function", [(dtypes.float32, "pk_exp2f("),
                                             (dtypes.float16, "pk_exp2f("),
                                             (dtypes.float64, "exp2(")])
def test_exp2_on_float_calls_the_inline_function(device, dtype, function):
    # libm's exp2f is a call that keeps the loop scalar: 5.6 ms for a SiLU kernel of
    # EfficientNet-B0 that takes 1.65 ms with a polynomial the compiler vectorizes
    source = device.renderer.render(exp2_kernel(dtype, BLOCK))
    body = source[source.index(f"static inline void {function_name('exp2_' + dtype.name)}("):]
    assert function in body and ("pk_exp2f" in body) == (dtype != dtypes.float64), body
    assert ("static inline float pk_exp2f" in source) == (dtype != dtypes.float64)


def float32_sweep() -> np.ndarray:
    """Every 1024th float32 bit pattern (all exponents, subnormals, infinities, NaNs), and every
    float32 next to where 2^a turns subnormal, rounds to 0 and overflows."""
    spaced = np.arange(0, 2**32, 2**10, dtype=np.uint64).astype(np.uint32).view(np.float32)
    steps = np.arange(-2**15, 2**15, dtype=np.int64)
    dense = [np.float32(np.sign(e)) * (np.abs(np.float32(e)).view(np.uint32) + steps)
             .astype(np.uint32).view(np.float32) for e in (-151, -150, -149, -126, -125, 127, 128)]
    # around 0: ±subnormals and ±0
    near_zero = np.abs(steps).astype(np.uint32).view(np.float32) * np.sign(steps, dtype=np.float32)
    x = np.concatenate([spaced, *dense, near_zero, np.float32([np.inf, -np.inf, np.nan])])
    assert x.dtype == np.float32
    return np.resize(x, -(-x.size // BLOCK) * BLOCK)


def test_exp2_on_float32_is_within_its_budget_on_a_dense_sweep(device):
    x = float32_sweep()
    _, got = launch(device, exp2_kernel(dtypes.float32, x.size), [x, np.zeros_like(x)])
    with np.errstate(all="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    ok, err = spec.within_budget(Op.EXP2, dtypes.float32, got, (want,))
    worst = int(np.argmax(err))
    assert ok.all(), (f"{int((~ok).sum())} of {x.size} past {spec.budget(Op.EXP2, dtypes.float32)}"
                      f" ulp; worst: exp2({x[worst]!r}) gave {got[worst]!r}, expected "
                      f"{want[worst]!r} ({err[worst]} ulp)")
    assert err.max() <= 1        # what pk_exp2f's comment promises


def test_exp2_on_float32_gives_the_special_values_exactly(device):
    # a ulp budget would let overflow give the largest float instead of inf
    x = np.resize(np.float32([np.inf, -np.inf, np.nan, 128, 200, 3e38, -151, -200, -3e38, 0,
                              -0.0, -149, -126.5]), BLOCK)
    _, got = launch(device, exp2_kernel(dtypes.float32, BLOCK), [x, np.zeros_like(x)])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, np.exp2(x.astype(np.float64)).astype(np.float32))
