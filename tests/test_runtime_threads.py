"""The runtime under threads: no two threads are ever inside the device at once (issue 11, 3).

OpenCL sets a kernel's arguments and then enqueues it, and wgpu-core frees buffers under other
threads' feet: a driver is entered by one thread at a time, through Runtime.device_lock.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from portkit import Tensor, runtime
from portkit.abi import BackendUnavailable, KernelBuilder, Op, dtypes
from portkit.abi.backend import Allocator


class _Guard:
    """Counts how often two threads were inside the device at the same time."""

    def __init__(self):
        self.inside, self.overlaps, self.lock = 0, 0, threading.Lock()

    def enter(self):
        with self.lock:
            self.inside += 1
            self.overlaps += self.inside > 1
        time.sleep(0.0005)        # a driver call takes a while and releases the GIL
        with self.lock:
            self.inside -= 1


class _GuardedAllocator(Allocator):
    def __init__(self, inner: Allocator, guard: _Guard):
        self.inner, self.guard = inner, guard

    def alloc(self, nbytes):
        self.guard.enter()
        return self.inner.alloc(nbytes)

    def free(self, buffer, nbytes):
        self.guard.enter()
        self.inner.free(buffer, nbytes)

    def copyin(self, buffer, source):
        self.guard.enter()
        self.inner.copyin(buffer, source)

    def copyout(self, destination, buffer):
        self.guard.enter()
        self.inner.copyout(destination, buffer)


def _add_one(size: int):
    k = KernelBuilder(f"add_one_{size}")
    out, x = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.special("group", 0)
    k.store(out, i, k.alu(Op.ADD, k.load(x, i), k.const(1.0, dtypes.float32)))
    return k.build(grid=(size, 1, 1), block=(1, 1, 1))


def test_no_two_threads_enter_the_device_at_once():
    guard = _Guard()
    cpu = runtime.get("cpu").device

    def program(name, binary):
        inner = cpu.program(name, binary)

        def launch(*args, **kwargs):
            guard.enter()
            return inner(*args, **kwargs)
        return launch

    device = dataclasses.replace(cpu, allocator=_GuardedAllocator(cpu.allocator, guard),
                                 program=program)
    rt = runtime.Runtime("cpu-guarded", device)
    wrong = []

    def work(thread: int):
        for i in range(12):
            size = 8 + (thread + i) % 3
            x = np.arange(size, dtype=np.float32) + 100 * thread + i
            out, _ = rt.run(_add_one(size), np.zeros(size, np.float32), x)
            wrong.extend([] if np.array_equal(out, x + 1) else [(thread, i)])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and guard.overlaps == 0


@pytest.mark.parametrize("device", ["cpu", "opencl", "webgpu"])
def test_threads_realizing_distinct_shapes_get_right_answers(device):
    try:
        runtime.get(device)
    except BackendUnavailable as error:
        pytest.skip(f"{device} is not available here: {error}")
    wrong, errors = [], []

    def work(thread: int):
        try:
            for i in range(10):
                x = np.arange(50 + 13 * thread + i, dtype=np.float32) + thread
                got = (Tensor(x, device=device) * 2 + 1).sum().numpy()
                if got != (x * 2 + 1).sum():
                    wrong.append((thread, i, got))
        except Exception as error:  # noqa: BLE001 - a raise in a thread would vanish
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
