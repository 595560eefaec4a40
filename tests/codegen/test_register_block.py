"""The packed matmul's register block is sized to the device's vector registers
(`Capabilities.vector_registers`, portkit/codegen/plan.py `register_block`): AVX-512 keeps
8 x 32 float32, AVX2's sixteen 256-bit registers get a block that fits them, and a device that
states none keeps SERIAL's; the blocks compute what numpy and torch do (kernels lowered for an
AVX2 datasheet run on the CPU backend, whatever the host's own registers)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from portkit import runtime, schedule
from portkit.abi.errors import CapabilityError
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.codegen.plan import SERIAL, register_block
from portkit.nn import functional as F
from portkit.reference_backends.cpu.capabilities import vector_registers
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
AVX2 = dataclasses.replace(LOOPS, vector_registers=(16, 32))
AVX512 = dataclasses.replace(LOOPS, vector_registers=(32, 64))
RNG = np.random.default_rng(0)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _close(actual: np.ndarray, expected: np.ndarray, k: int) -> None:
    """Within the gamma_k bound of a float32 dot product of length k (with margin)."""
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound)


def _registers(rows: int, width: int, size: int) -> int:
    """Vector registers of `size` bytes that rows x width float32 accumulators fill."""
    return rows * -(-width * 4 // size)


def test_an_avx2_block_fits_its_registers_and_an_avx512_block_is_8_by_32():
    limits = register_block(AVX2)
    # all but a few of the 16 registers: B's vectors and A's broadcast take the rest
    assert 8 <= _registers(limits.reuse, limits.vector, 32) <= 12, limits
    assert limits.accumulators == limits.reuse * limits.vector
    assert (register_block(AVX512).reuse, register_block(AVX512).vector) == (8, 32)
    assert register_block(AVX512) == SERIAL == register_block(LOOPS)


@pytest.mark.parametrize("registers", [(16, 16), (32, 16), (8, 32), (1, 4)])
def test_smaller_register_files_get_blocks_that_fit(registers):
    count, size = registers
    limits = register_block(dataclasses.replace(LOOPS, vector_registers=registers))
    assert limits.reuse >= 1 and limits.vector >= 1
    assert _registers(limits.reuse, limits.vector, size) <= max(count - 4, 1), limits


def test_the_cpu_states_the_widest_register_file_its_flags_name():
    assert vector_registers({"sse2", "avx", "avx2", "fma"}) == (16, 32)
    assert vector_registers({"sse2", "avx", "avx2", "avx512f"}) == (32, 64)
    assert vector_registers({"asimd"}) == (32, 16)
    assert vector_registers(set()) is None


@pytest.mark.parametrize("registers", [(0, 32), (16, 2), (16,), [16, 32], (16.0, 32)])
def test_a_malformed_register_file_is_refused_when_the_backend_loads(registers):
    caps = dataclasses.replace(LOOPS, vector_registers=registers)
    with pytest.raises(CapabilityError, match="vector_registers"):
        caps.validate("test")


def _matmul(m: int, k: int, n: int, device: str = "interpreter"):
    a, b = _floats(m, k), _floats(k, n)
    item, = schedule.create_schedule([(Tensor(a, device=device) @ Tensor(b, device=device)).lazy])
    return a, b, item


def test_an_avx2_matmul_takes_two_full_rows_where_m_is_a_power_of_two():
    _, _, item = _matmul(256, 64, 256)
    assert pack.find(item.root, item.inputs, AVX512)[1].rows == 8
    packing = pack.find(item.root, item.inputs, AVX2)[1]
    # 3 rows would leave 86 blocks of 256, 2 per group at most: the B panel barely reused
    assert (packing.rows, packing.width) == (2, 32) and packing.blocks >= 32


def _conv(c: int, size: int, device: str = "interpreter", rows: int = 0, out: int = 0):
    x, w = _floats(1, c, rows or size, size), _floats(out or c, c, 3, 3)
    out = F.conv2d(Tensor(x, device=device), Tensor(w, device=device), padding=1)
    return x, w, schedule.create_schedule([out.lazy])[-1]


def test_a_56_wide_conv_row_takes_3_row_blocks_with_a_remainder_on_avx2():
    _, _, item = _conv(64, 56)
    assert pack.find(item.root, item.inputs, AVX512)[1].rows == 8
    packing = pack.find(item.root, item.inputs, AVX2)[1]
    assert (packing.rows, packing.width) == (3, 32) and packing.blocks == 19


@pytest.mark.parametrize("size", [7, 14, 28])
def test_a_folded_conv_keeps_each_block_in_one_row(size):
    _, _, item = _conv(32, size)
    found, packing = pack.find(item.root, item.inputs, AVX2)
    assert found.fold and size % packing.rows == 0, packing


def test_a_weight_gradient_reads_a_staged_a_in_blocks_that_fit():
    x = Tensor(_floats(1, 32, 14, 14), device="cpu", requires_grad=True)
    w = Tensor(_floats(64, 32, 3, 3), device="cpu", requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    (y * y).sum().backward()            # dy = 2y: a weight gradient with a B to read
    cpu = runtime.get("cpu").capabilities
    avx2, avx512 = (dataclasses.replace(cpu, vector_registers=(count, size))
                    for count, size in ((16, 32), (32, 64)))
    items = schedule.create_schedule([w.grad.lazy])
    found = [pack.find(item.root, item.inputs, avx2) for item in items]
    # the forward conv (dy needs y), then the weight gradient: a sum over several axes
    (item, (_, packing)), = [(item, f) for item, f in zip(items, found) if f and f[0].k_fold]
    assert packing.packed_a and packing.rows == 3
    assert pack.find(item.root, item.inputs, avx512)[1].rows == 8


@pytest.mark.parametrize("m, k, n", [(64, 300, 70), (29, 65, 64), (56, 24, 33)])
def test_avx2_blocks_compute_the_matmul_on_the_cpu(m, k, n):
    a, b, item = _matmul(m, k, n)
    packing = pack.find(item.root, item.inputs, AVX2)[1]
    assert packing.rows == 3 and m % 3 != 0      # a remainder block along m
    kernel = lower(item.root, item.inputs, AVX2)
    by_size = {a.size: a.ravel(), b.size: b.ravel()}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(m * n, np.float32),
                                             *(by_size[int(np.prod(x.shape))]
                                               for x in item.inputs))
    _close(out.reshape(m, n), a.astype(np.float64) @ b, k)


def test_avx2_blocks_compute_the_conv_on_the_cpu():
    x, w, item = _conv(8, 56, rows=3, out=40)       # 3 output rows of 56, an edge along n
    assert pack.find(item.root, item.inputs, AVX2)[1].rows == 3
    kernel = lower(item.root, item.inputs, AVX2)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    by_size = {a.size: a.ravel() for a in (x, w, padded)}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(40 * 3 * 56, np.float32),
                                             *(by_size[int(np.prod(n.shape))]
                                               for n in item.inputs))
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(),
                                          torch.from_numpy(w).double(), padding=1).numpy()
    _close(out.reshape(expected.shape), expected, 72)


@pytest.mark.parametrize("m, k, n", [(256, 64, 256), (512, 300, 96), (56, 576, 64)])
def test_cpu_matmuls_with_the_hosts_block_match_numpy(m, k, n):
    caps = runtime.get("cpu").capabilities
    a, b, item = _matmul(m, k, n, device="cpu")
    assert pack.find(item.root, item.inputs, caps)[1].rows <= register_block(caps).reuse
    out = (Tensor(a, device="cpu") @ Tensor(b, device="cpu")).numpy()
    _close(out, a.astype(np.float64) @ b, k)


def test_an_avx2_block_is_written_in_register_wide_vectors_one_b_vector_at_a_time():
    # ViT's MLP up-projection: 3 x 32 blocks on AVX2. Written as 16-lane vectors (two
    # registers each) in the kernel's order (a row's whole width, then the next row), clang
    # kept all four B vectors live and spilled an accumulator per step (29 GFLOP/s, one
    # thread, against 47 so)
    a, b = _floats(197, 384), _floats(384, 1536)
    item, = schedule.create_schedule([(Tensor(a, device="interpreter")
                                       @ Tensor(b, device="interpreter")).lazy])
    assert pack.find(item.root, item.inputs, AVX2)[1].rows == 3
    kernel = lower(item.root, item.inputs, AVX2)
    source = CPURenderer(32).render(kernel)
    updates = re.findall(r"(acc\d+) = pk_f32x8_fma\((\w+), &(\w+)\[(\w+) \+ (\d+)\]", source)
    assert len(updates) == 12 and "pk_f32x16" not in source, source
    # consecutive updates load one B vector for all three rows, then the next vector
    offsets = [int(offset) for *_, offset in updates]
    assert offsets == sorted(offsets) and len(set(offsets)) == 4, updates
    for at in range(0, 12, 3):
        assert len({shared for _, shared, *_ in updates[at:at + 3]}) == 3, updates
    by_size = {a.size: a, b.size: b}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(197 * 1536, np.float32),
                                     *(by_size[node.size] for node in item.inputs))
    _close(out.reshape(197, 1536), a.astype(np.float64) @ b, 384)


def test_a_block_with_more_rows_than_vectors_keeps_the_row_order():
    # a strided 1x1 conv onto a 7 x 7 map keeps 7 x 32 blocks (pack.py `short_rows`; a
    # stride-1 one is a matmul along its positions), which spill on AVX2 either way: one
    # row's four vectors at a time hold fewer operands than seven rows'
    x, w = _floats(1, 64, 14, 14), _floats(64, 64, 1, 1)
    y = Tensor(x, device="interpreter").conv2d(Tensor(w, device="interpreter"), stride=2)
    item = max(schedule.create_schedule([y.lazy]), key=lambda item: item.root.size)
    kernel = lower(item.root, item.inputs, AVX2)
    updates = re.findall(r"(acc\d+) = pk_f32x8_fma\((\w+), &(\w+)\[(\w+) \+ (\d+)\]",
                         CPURenderer(32).render(kernel))
    assert len(updates) == 28, updates
    for at in range(0, 28, 4):
        assert len({shared for _, shared, *_ in updates[at:at + 4]}) == 1, updates
        assert [int(offset) for *_, offset in updates[at:at + 4]] == [0, 8, 16, 24], updates


def test_the_cpu_backend_writes_vectors_as_wide_as_the_host_registers():
    registers = runtime.get("cpu").capabilities.vector_registers
    expected = 64 if registers is None else registers[1]
    assert runtime.get("cpu").device.renderer.vector_bytes == expected
