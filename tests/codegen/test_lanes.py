"""Accumulators held in vectors (portkit/codegen/lanes.py and the CPU renderer): which runs of
ACCs qualify, that the C holds them in GNU C vectors with one fused update per iteration, that
the compiler makes packed FMAs of it, and that the kernel computes what the interpreter does."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

from portkit import runtime, schedule
from portkit.abi import KernelBuilder, Op, dtypes
from portkit.codegen import lanes
from portkit.codegen.lower import lower
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.cpu.runtime import cpu_flags
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

CAPABILITIES = capabilities()

F32 = dtypes.float32
WIDTHS = {F32: 16}


def _kernel(offsets=tuple(range(16)), shared=True, store_inside=False, read_inside=False,
            flushed=None, stored=tuple(range(16))):
    """16 float32 accumulators, acc[j] += a[i] * b[16 i + offsets[j]] over 8 iterations, then
    stored into out[stored[j]]: a run of lanes unless a change says otherwise. With `flushed`,
    acc[j] is added into out[16 + flushed[j]] after the loop (the running sums of a packed
    matmul) instead."""
    k = KernelBuilder("lanes")
    out, a, b = k.param(F32), k.param(F32), k.param(F32)
    zero = k.const(0.0, F32)
    accs = [k.acc(zero) for _ in range(16)]
    with k.loop(k.const(0), k.const(8)) as i:
        x = k.load(a, i)
        base = k.alu(Op.MUL, i, k.const(16))
        for lane, acc in enumerate(accs):
            at = k.alu(Op.ADD, base, k.const(offsets[lane])) if offsets[lane] else base
            y = k.load(b, at)
            mine = x if shared else k.load(a, k.alu(Op.ADD, i, k.const(lane % 2)))
            if store_inside and lane == 8:
                k.store(out, k.const(0), y)
            if read_inside and lane == 8:
                k.store(out, k.const(1), accs[3])
            k.assign(acc, k.alu(Op.MULACC, mine, y, acc))
    if flushed is None:
        for lane, acc in enumerate(accs):
            k.store(out, k.const(stored[lane]), acc)
        return k.build()
    start = k.alu(Op.ADD, k.special("group", 0), k.const(16))     # not a constant: group 0
    for lane, acc in enumerate(accs):
        at = k.alu(Op.ADD, start, k.const(flushed[lane]))
        k.store(out, at, k.alu(Op.ADD, k.load(out, at), acc))
    return k.build()


def test_sixteen_accumulators_updated_from_consecutive_loads_are_one_run():
    run, = lanes.find(_kernel(), WIDTHS)
    assert len(run.accs) == 16 and run.offset == 0
    assert lanes.find(_kernel(), {}) == []              # a dtype without vectors stays scalar


@pytest.mark.parametrize("change", [
    {"offsets": (0, 2, *range(2, 16))},      # lanes 1 and 2 read the same address
    {"shared": False},                       # no operand is common to every lane
    {"store_inside": True},                  # a STORE among the updates may change b
    {"read_inside": True},                   # an accumulator is read mid-loop
])
def test_runs_the_pattern_does_not_fit_stay_scalar(change):
    assert lanes.find(_kernel(**change), WIDTHS) == []


@pytest.mark.parametrize("change", [{}, {"offsets": (0, 2, *range(2, 16))}, {"shared": False}])
def test_the_cpu_computes_what_the_interpreter_does(change):
    kernel = _kernel(**change)
    rng = np.random.default_rng(0)
    arrays = (np.zeros(16, np.float32), rng.standard_normal(9).astype(np.float32),
              rng.standard_normal(8 * 16 + 16).astype(np.float32))
    expected, *_ = runtime.get("interpreter").run(kernel, *arrays)
    actual, *_ = runtime.get("cpu").run(kernel, *arrays)
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_the_c_holds_a_run_in_one_vector_with_one_update_per_iteration():
    source = CPURenderer().render(_kernel())
    assert "typedef float pk_f32x16 __attribute__((vector_size(64)));" in source
    assert source.count("pk_f32x16_fma(") == 2          # the helper, and the one update
    assert " fma(" not in source


def test_lanes_stored_to_consecutive_elements_after_the_loop_are_one_vector_store():
    # a packed matmul's sums of one depth block, stored from its registers to the output
    source = CPURenderer().render(_kernel())
    assert source.count("pk_f32x16_store(&data0[") == 1 and "acc4[15]" not in source
    swapped = _kernel(stored=(1, 0, *range(2, 16)))
    run, = lanes.find(swapped, WIDTHS)
    assert lanes.flush(swapped, run) is None
    source = CPURenderer().render(swapped)
    assert "pk_f32x16_store(&data0[" not in source and "acc4[15]" in source    # as elements
    rng = np.random.default_rng(0)
    arrays = (np.zeros(16, np.float32), rng.standard_normal(9).astype(np.float32),
              rng.standard_normal(8 * 16).astype(np.float32))
    for kernel in (_kernel(), swapped):
        expected, *_ = runtime.get("interpreter").run(kernel, *arrays)
        actual, *_ = runtime.get("cpu").run(kernel, *arrays)
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_lanes_added_into_consecutive_elements_after_the_loop_are_one_vector_add():
    kernel = _kernel(flushed=tuple(range(16)))
    run, = lanes.find(kernel, WIDTHS)
    assert lanes.flush(kernel, run) is not None
    source = CPURenderer().render(kernel)
    assert source.count("pk_f32x16_add_into(&data0[") == 1 and "acc4[3]" not in source
    swapped = _kernel(flushed=(1, 0, *range(2, 16)))        # lanes 0 and 1 go to each other's place
    run, = lanes.find(swapped, WIDTHS)
    assert lanes.flush(swapped, run) is None
    assert "pk_f32x16_add_into(&data0[" not in CPURenderer().render(swapped)


@pytest.mark.parametrize("offsets", [tuple(range(16)), (1, 0, *range(2, 16))])
def test_a_flush_computes_what_the_interpreter_does(offsets):
    kernel = _kernel(flushed=offsets)
    rng = np.random.default_rng(0)
    arrays = (rng.standard_normal(32).astype(np.float32), rng.standard_normal(9).astype(np.float32),
              rng.standard_normal(8 * 16).astype(np.float32))
    expected, *_ = runtime.get("interpreter").run(kernel, *arrays)
    actual, *_ = runtime.get("cpu").run(kernel, *arrays)
    np.testing.assert_allclose(actual, expected, rtol=1e-6)
    assert not np.array_equal(actual[16:], arrays[0][16:])     # the sums were added


def _packed_matmul_source() -> str:
    a, b = Tensor(np.ones((64, 256), np.float32)), Tensor(np.ones((256, 64), np.float32))
    item, = schedule.create_schedule([(a @ b).lazy])
    caps = dataclasses.replace(CAPABILITIES, threads_are_loops=True)
    return CPURenderer().render(lower(item.root, item.inputs, caps))


def test_a_packed_register_block_is_sixteen_vectors_of_sixteen_lanes():
    source = _packed_matmul_source()
    assert source.count(" = pk_f32x16_fma(") == 16      # 8 rows x 2 vectors of 32 columns


def test_the_compiler_makes_packed_fmas_of_the_vectors():
    compiler = runtime.get("cpu").device.compiler
    command = [*compiler.command, *(f for f in compiler.flags if f != "-shared"),
               "-S", "-x", "c", "-", "-o", "-"]
    assembly = subprocess.run(command, input=_packed_matmul_source(), capture_output=True,
                              text=True, check=True).stdout
    if "avx512f" not in cpu_flags():        # no 512-bit registers: the compiler splits lanes
        assert re.search(r"\bv?mul(ps|ss)\b|vfmadd", assembly)
        return
    # packed math on 16 lanes; clang honours the helper's FP_CONTRACT pragma and fuses it, gcc
    # ignores the pragma and multiplies, then adds (the ABI allows both)
    assert re.search(r"\bv(fmadd\d+|mul)ps\s[^\n]*%zmm", assembly)
    if "clang" in compiler.version:
        assert re.search(r"\bvfmadd231ps\s[^\n]*%zmm", assembly)
