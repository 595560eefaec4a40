"""Batched compiles (Compiler.compile_batch, ABI 0.6) through Runtime.compile_all: several
kernels in one batch run correctly, one failing source reports its own kernel's error while the
others still work, the disk cache keeps each kernel on its own, a compiler without a batch
entry still compiles everything, the batches share the kernels evenly among the threads, and a
batch compiles while the kernels after it are still being made."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from portkit import backends
from portkit.abi import CompileError, Compiler, KernelBuilder, Op, Renderer, dtypes
from portkit.abi.errors import BackendUnavailable
from portkit.runtime import Compiled, Runtime
from portkit.runtime.device import BATCH, batch_sizes

N = 16


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    return tmp_path


def scale(factor: int, name: str | None = None):
    """y[i] = x[i] * factor + i over N float32 elements."""
    k = KernelBuilder(name or f"scale_{factor}")
    x, y = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(4)), k.special("local", 0))
    value = k.alu(Op.ADD, k.alu(Op.MUL, k.load(x, i), k.const(float(factor), dtypes.float32)),
                  k.cast(i, dtypes.float32))
    k.store(y, i, value)
    return k.build(grid=(4, 1, 1), block=(4, 1, 1))


class Breaking(Renderer):
    """Renders as `inner` does, but the kernel named `broken` as source no compiler takes."""

    def __init__(self, inner: Renderer, broken: str):
        self.inner, self.broken = inner, broken

    def render(self, kernel) -> str:
        source = self.inner.render(kernel)
        return source + ("\n#error broken on purpose\n" if kernel.name == self.broken else "")


class Counting(Compiler):
    """Wraps a compiler and records the sources of each call."""

    def __init__(self, inner: Compiler, batch: bool = True):
        self.inner, self.cache_key, self.calls = inner, inner.cache_key, []
        if not batch:   # the ABI's default: one by one through compile
            self.compile_batch = lambda sources: Compiler.compile_batch(self, sources)

    def compile(self, source: str) -> bytes:
        self.calls.append(("compile", [source]))
        return self.inner.compile(source)

    def compile_batch(self, sources: list[str]) -> list:
        self.calls.append(("batch", list(sources)))
        return self.inner.compile_batch(sources)


def load(name: str):
    try:
        return backends.load(name)
    except BackendUnavailable as error:
        pytest.skip(f"{name}: {error}")


def fresh(name: str, broken: str = "", batch: bool = True) -> tuple[Runtime, Counting]:
    device = load(name)
    compiler = Counting(device.compiler, batch)
    device = dataclasses.replace(device, compiler=compiler,
                                 renderer=Breaking(device.renderer, broken))
    return Runtime(name, device), compiler


def check(rt: Runtime, compiled, factor: int) -> None:
    x = np.arange(N, dtype=np.float32)
    buffers = [rt.alloc(dtypes.float32, N).copyin(x), rt.alloc(dtypes.float32, N)]
    rt.launch(compiled, buffers, wait=True)
    np.testing.assert_array_equal(buffers[1].numpy(), x * factor + np.arange(N))


@pytest.mark.parametrize("name", ["cpu", "opencl"])
def test_a_batch_compiles_once_and_every_kernel_runs(name):
    rt, compiler = fresh(name)
    kernels = [scale(f) for f in (2, 3, 5, 7)]
    done = rt.compile_all(kernels, jobs=1)
    assert [kind for kind, _ in compiler.calls] == ["batch"]
    assert len(compiler.calls[0][1]) == 4
    for factor, compiled in zip((2, 3, 5, 7), done):
        check(rt, compiled, factor)
    assert rt.compile(kernels[0]) is done[0]    # in the in-memory cache too


@pytest.mark.parametrize("name", ["cpu", "opencl"])
def test_a_failing_source_gets_its_own_error_and_the_others_work(name):
    rt, _ = fresh(name, broken="scale_3")
    done = rt.compile_all([scale(f) for f in (2, 3, 5)], jobs=1)
    assert isinstance(done[1], CompileError)
    assert "broken on purpose" in done[1].source    # its own source, not the batch's
    assert "scale_2" not in done[1].source and "scale_5" not in done[1].source
    check(rt, done[0], 2)
    check(rt, done[2], 5)


@pytest.mark.parametrize("name", ["cpu", "opencl"])
def test_kernels_of_one_name_share_no_entry_point(name):
    rt, _ = fresh(name)
    done = rt.compile_all([scale(2, "twin"), scale(3, "twin")], jobs=1)
    check(rt, done[0], 2)
    check(rt, done[1], 3)


@pytest.mark.parametrize("name", ["cpu", "opencl"])
def test_a_backend_builds_sources_of_one_kernel_name_apart(name):
    device = load(name)
    sources = [device.renderer.render(scale(f, "twin")) for f in (2, 3)]
    first, second = device.compiler.compile_batch(sources)
    assert first != second
    rt = Runtime(name, device)
    for factor, source, binary in zip((2, 3), sources, (first, second)):
        kernel = rt.prepare(scale(factor, "twin"))
        check(rt, Compiled(kernel, source, device.program("twin", binary), 0.0), factor)


def test_the_disk_cache_keeps_each_kernel_of_a_batch():
    rt, _ = fresh("cpu")
    rt.compile_all([scale(2), scale(3)], jobs=1)
    again, compiler = fresh("cpu")     # a new process: empty in-memory caches
    done = again.compile_all([scale(2), scale(3), scale(5), scale(7)], jobs=1)
    assert compiler.calls == [("batch", [again.device.renderer.render(scale(f))
                                         for f in (5, 7)])]
    for factor, compiled in zip((2, 3, 5, 7), done):
        check(again, compiled, factor)


def test_a_compiler_without_a_batch_entry_compiles_one_by_one():
    rt, compiler = fresh("cpu", batch=False)
    done = rt.compile_all([scale(2), scale(3), scale(5)], jobs=2)
    assert sorted(kind for kind, _ in compiler.calls) == ["compile"] * 3
    for factor, compiled in zip((2, 3, 5), done):
        check(rt, compiled, factor)


def test_batches_split_over_jobs():
    rt, compiler = fresh("cpu")
    rt.compile_all([scale(f) for f in range(2, 8)], jobs=2)
    assert sorted(len(sources) for _, sources in compiler.calls) == [3, 3]


def test_batches_share_the_kernels_evenly_among_jobs():
    # 97 kernels on 2 threads in batches of 32 left a fourth batch of 1 to one thread alone
    assert batch_sizes(97, 2) == [25, 24, 24, 24]
    assert batch_sizes(30, 2) == [15, 15]
    assert batch_sizes(1, 4) == [1]
    assert batch_sizes(0, 2) == []
    for count in range(1, 300):
        for jobs in (1, 2, 3, 16):
            sizes = batch_sizes(count, jobs)
            assert sum(sizes) == count and max(sizes) <= BATCH
            assert max(sizes) - min(sizes) <= 1, (count, jobs, sizes)
            assert len(sizes) % jobs == 0 or len(sizes) == count, (count, jobs, sizes)


def test_a_batch_compiles_while_later_kernels_are_still_being_made():
    rt, compiler = fresh("cpu")
    seen_before_last = []

    def made():
        for number, factor in enumerate((2, 3, 5, 7)):
            if number == 2:     # the first batch of two is full: it compiles meanwhile
                for _ in range(1000):
                    if compiler.calls:
                        break
                    time.sleep(0.01)
                seen_before_last.append(len(compiler.calls))
            yield scale(factor)
    done = rt.compile_all(made(), jobs=2, count=4)
    assert seen_before_last == [1]
    assert sorted(len(sources) for _, sources in compiler.calls) == [2, 2]
    for factor, compiled in zip((2, 3, 5, 7), done):
        check(rt, compiled, factor)
