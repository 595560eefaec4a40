"""Loops vectorized on the CPU (codegen/vectorize.py): the 14-column interior of a padded SiLU
row is asked for clang's masked vectorization (`short_loop_pragma`); a mean of SiLU terms
computes them in a loop of their own and sums them in order, to the same bits; a loop of
strided loads is left alone; a row of stride-2 loads, or one reading many buffers, is asked
for vectors unmasked; the values against numpy."""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from portkit import runtime, schedule
from portkit.abi import dtypes
from portkit.abi.kernel import KernelBuilder
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.vectorize import split_sums
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

PRAGMA = CPURenderer.short_loop_pragma or ""
LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
PADS = ((0, 0), (0, 0), (2, 2), (2, 2))


def _floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _source(out: Tensor) -> str:
    item, = schedule.create_schedule([out.lazy])
    return CPURenderer().render(lower(item.root, item.inputs, LOOPS))


def _silu(x: np.ndarray, bias: np.ndarray) -> tuple[Tensor, np.ndarray]:
    h = Tensor(x, device="cpu") + Tensor(bias, device="cpu")
    wide = x.astype(np.float64) + bias
    return h * h.sigmoid(), wide / (1 + np.exp(-wide))


def _pragma_loops(source: str) -> list[str]:
    """The header of each loop that the pragma precedes."""
    return re.findall(re.escape(PRAGMA) + r"\n\s*(for \(.*)", source)


def _check_padded_row_masked(channels: int, side: int) -> np.ndarray:
    """SiLU(x + bias) on a side x side map, padded by PADS: its loop over a row's unpadded
    columns (2 to side + 2) is asked for vectors with its tail masked, and the values are
    right; returns the bias."""
    x, bias = _floats(1, channels, side, side), _floats(1, channels, 1, 1, seed=1)
    ours, expected = _silu(x, bias)
    padded = ours.pad(PADS)
    headers = _pragma_loops(_source(padded))
    assert any(re.search(rf"= 2; \w+ < {side + 2};", h) for h in headers), headers
    np.testing.assert_allclose(padded.numpy(), np.pad(expected, PADS), rtol=2e-6, atol=1e-7)
    return bias


def test_a_padded_silu_row_is_vectorized_with_its_tail_masked():
    _check_padded_row_masked(24, 14)


def _mean_kernel(channels: int):
    """The kernel of a mean over each 14 x 14 map of SiLU(x + bias), its inputs in order."""
    x, bias = _floats(1, channels, 14, 14), _floats(1, channels, 1, 1, seed=1)
    ours, expected = _silu(x, bias)
    pooled = ours.mean(axis=(2, 3))
    item, = schedule.create_schedule([pooled.lazy])
    arrays = {x.shape: x, bias.shape: bias}
    kernel = lower(item.root, item.inputs, LOOPS)
    return kernel, [arrays[lazy.shape] for lazy in item.inputs], pooled, expected


def test_a_sum_of_silu_terms_computes_them_in_a_loop_of_their_own():
    kernel, _, pooled, expected = _mean_kernel(24)
    split = split_sums(kernel)
    assert sum(n.op is Op.LOCAL for n in split.nodes) == 1 + sum(
        n.op is Op.LOCAL for n in kernel.nodes), "no LOCAL array of terms"
    source = CPURenderer().render(kernel)
    terms = source[source.index(PRAGMA):]
    terms = terms[:terms.index("\n        }")]       # the terms' loop, to its closing brace
    # the sigmoid's exponential (its 2^k a bit cast) is in the terms' loop, the sum is not
    assert "union { int32_t from; float to; }" in terms and "acc" not in terms, terms
    assert re.search(r"for \(int32_t \w+ = 0; \w+ < 14;[^}]*= local\d+\[[^}]*acc\d+ = ",
                     source), source
    np.testing.assert_allclose(pooled.numpy(), expected.mean(axis=(2, 3)), rtol=1e-5,
                               atol=1e-6)


def test_a_split_sum_adds_in_the_same_order():
    kernel, inputs, _, _ = _mean_kernel(3)
    interpreter = runtime.get("interpreter")
    out = np.zeros(3, np.float32)
    before, *_ = interpreter.run(kernel, out, *inputs)
    after, *_ = interpreter.run(split_sums(kernel), out, *inputs)
    np.testing.assert_array_equal(after, before)


def _row_loop(stride: int):
    """out[r] = in[stride * r] for r in 0..13: one short loop."""
    b = KernelBuilder("rows")
    out, src = b.param(dtypes.float32), b.param(dtypes.float32)
    row = b.add(Op.RANGE, dtypes.int32, (b.const(0), b.const(14)))
    b.store(out, row, b.load(src, b.alu(Op.MUL, row, b.const(stride))))
    b.add(Op.END, None, (row,))
    return b.build()


def test_a_short_loop_of_strided_loads_is_left_to_the_compiler():
    # vectorized, a depthwise convolution's loop over rows 18 floats apart gathered its loads
    assert _pragma_loops(CPURenderer().render(_row_loop(1))) != []
    assert _pragma_loops(CPURenderer().render(_row_loop(18))) == []


def test_a_row_with_a_tail_is_vectorized_with_its_tail_masked():
    # a 28-wide row of SiLU: one 16-lane step and a masked one, not 12 scalar exponentials;
    # rows that 16 lanes divide are left to the compiler
    bias = _check_padded_row_masked(8, 28)
    wide, _ = _silu(_floats(1, 8, 28, 32), bias)
    assert _pragma_loops(_source(wide)) == []


def test_a_row_of_stride_2_loads_is_asked_for_vectors_unmasked():
    # a stride-2 5x5 depthwise conv's row too long to be written out (66 wide: a 28-wide row
    # is, codegen/straight.py): clang's cost model left such a row scalar, and masked, its
    # stride-2 loads became gathers; unmasked it loads pairs and shuffles
    x, w = _floats(1, 8, 131, 131), _floats(8, 1, 5, 5, seed=1)
    out = Tensor(x, device="cpu").conv2d(Tensor(w, device="cpu"), stride=2, padding=2, groups=8)
    item = schedule.create_schedule([out.lazy])[-1]     # after the padded copy
    source = CPURenderer().render(lower(item.root, item.inputs, LOOPS))
    strided = re.findall(re.escape(CPURenderer.strided_loop_pragma or "") + r"\n\s*(for \(.*)",
                         source)
    assert any(re.search(r"= 0; \w+ < 66;", h) for h in strided), source
    import torch
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), stride=2, padding=2,
                                     groups=8)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_a_row_reading_many_buffers_is_asked_for_vectors_unmasked():
    # a row reading more buffers than clang checks for overlap with its store (an LSTM's gate
    # gradients read 9) stayed scalar, however long; a row of three is left to the compiler
    def asked(count: int) -> list[str]:
        arrays = [_floats(4, 64, seed=k) for k in range(count)]
        out = Tensor(arrays[0], device="cpu")
        for a in arrays[1:]:
            out = out * Tensor(a, device="cpu") + 1
        source = _source(out)
        expected = arrays[0].astype(np.float64)
        for a in arrays[1:]:
            expected = expected * a + 1
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
        return re.findall(re.escape(CPURenderer.strided_loop_pragma or "") + r"\n\s*(for \(.*)",
                          source)
    assert any(re.search(r"= 0; \w+ < 64;", h) for h in asked(10))
    assert asked(3) == []


def test_a_column_sum_unrolled_over_many_rows_is_asked_for_vectors():
    # a bias gradient: 64 rows of a ReLU-masked gradient summed per column, unrolled, make 128
    # loads a column from two buffers; clang would check each for overlap with the store, more
    # than it will, and left the loop over columns scalar
    dy, h = _floats(64, 512), _floats(64, 512, seed=1)
    out = (Tensor(dy, device="cpu") * (Tensor(h, device="cpu") > 0)).sum(0)
    strided = re.findall(re.escape(CPURenderer.strided_loop_pragma or "") + r"\n\s*(for \(.*)",
                         _source(out))
    assert len(strided) == 1, strided
    np.testing.assert_allclose(out.numpy(), (dy * (h > 0)).sum(0), rtol=1e-5, atol=1e-5)


def test_a_row_max_compiles_to_vector_compares():
    # A float MAX is two selects (NaN first), not one select of (a > b || a != a): clang 14's
    # SLP vectorizer takes no vector of the ||'s booleans, and a row max's 16 accumulators
    # stayed scalar, one xmm compare each (560 x 2000 at 0.30 ms; 0.14 as vectors).
    import subprocess

    from portkit.reference_backends.cpu.runtime import cpu_flags
    x = _floats(64, 2000)
    x[5, 17] = np.nan
    out = Tensor(x, device="cpu").amax(-1)
    compiler = runtime.get("cpu").device.compiler
    if "avx2" in cpu_flags() or "avx512f" in cpu_flags():
        command = [*compiler.command, *(f for f in compiler.flags if f != "-shared"),
                   "-S", "-x", "c", "-", "-o", "-"]
        assembly = subprocess.run(command, input=_source(out), capture_output=True, text=True,
                                  check=True).stdout
        assert re.search(r"\bvcmp\w*ps\s[^\n]*%[yz]mm", assembly), "no vector compare"
    expected = x.max(-1)
    np.testing.assert_array_equal(out.numpy(), expected)     # NaN wins in row 5
    assert np.isnan(out.numpy()[5])
