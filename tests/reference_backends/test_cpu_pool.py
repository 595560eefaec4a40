"""The cpu backend's thread pool (runtime.py): a launch never waits for a worker that claimed no
chunk, results are the same bits on 1, 2 and 3 threads, Python threads may launch at once, and
an idle worker naps for a second before it blocks.
Each thread count is its own process: the pool starts once, with `runtime.threads()`."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.reference_backends import cpu

# A reduce, a matmul and a kernel with barriers, each large enough to be spread over cores;
# prints a digest of each result. With "held", the pool's workers never claim a chunk.
SCRIPT = """
import hashlib, sys
import numpy as np
import pytest
sys.path.insert(0, sys.argv[1])
from test_cpu import launch, tree_sum_kernel
from portkit.reference_backends import cpu
from portkit.reference_backends.cpu import runtime
from portkit.tensor import Tensor

device = cpu.backend.load()
if sys.argv[2] == "held":
    runtime._native(device.compiler)[0].pk_pool_hold(1)
rng = np.random.default_rng(0)
x = rng.standard_normal((512, 1000)).astype(np.float32)
a, b = rng.standard_normal((2, 192, 192)).astype(np.float32)
sums = Tensor(x, device="cpu").sum(axis=1).numpy()
product = (Tensor(a, device="cpu") @ Tensor(b, device="cpu")).numpy()
tree = launch(device, tree_sum_kernel(256, 64), [x.ravel()[:256 * 64], np.zeros(64, np.float32)])
np.testing.assert_allclose(sums, x.sum(axis=1, dtype=np.float64), rtol=1e-4, atol=1e-3)
np.testing.assert_allclose(product, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
np.testing.assert_allclose(tree[1], x.ravel()[:256 * 64].reshape(64, 256).sum(axis=1,
                           dtype=np.float64), rtol=1e-4, atol=1e-3)
for values in (sums, product, tree[1]):
    print(hashlib.sha256(values.tobytes()).hexdigest())
"""


def run_script(threads: int, mode: str = "free") -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    ran = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent), mode],
                         env=env, check=False, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout.split()


def test_results_are_the_same_bits_on_1_2_and_3_threads():
    one = run_script(1)
    assert len(one) == 3
    assert run_script(2) == one and run_script(3) == one


def test_a_worker_that_never_wakes_does_not_stall_a_launch():
    # Workers held (pk_pool_hold) claim nothing, as a descheduled one would: the caller runs
    # every chunk itself and returns. A fork-join team (OpenMP's) would wait for them forever.
    assert run_script(2, "held") == run_script(1)


# After a launch on 2 threads: the worker blocked on the pool's condition variable 50 ms
# later, and 1.5 s later (a count of blocked workers each).
DROWSY = """
import time
import numpy as np
import pytest
from portkit.reference_backends import cpu
from portkit.reference_backends.cpu import runtime
from portkit.tensor import Tensor

device = cpu.backend.load()
library = runtime._native(device.compiler)[0]
x = np.random.default_rng(0).standard_normal((512, 1000)).astype(np.float32)
Tensor(x, device="cpu").sum(axis=1).numpy()
time.sleep(0.05)
print(library.pk_pool_sleeping())
time.sleep(1.5)
print(library.pk_pool_sleeping())
"""


def test_an_idle_worker_naps_for_a_second_before_it_blocks():
    # a worker blocked on the condition variable halts its core in a VM, and the next call's
    # first launch woke it milliseconds late: for a second after a launch it naps instead,
    # then blocks, so an idle process costs nothing after that
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    ran = subprocess.run([sys.executable, "-c", DROWSY], env=env, check=False,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["0", "1"]


def scale_kernel(groups: int, size: int):
    """out[i] = 3 x[i] + 1 over groups x size threads."""
    k = KernelBuilder("scale")
    x, out = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(size)), k.special("local", 0))
    k.store(out, i, k.alu(Op.ADD, k.alu(Op.MUL, k.load(x, i), k.const(3.0, dtypes.float32)),
                                 k.const(1.0, dtypes.float32)))
    return k.build(grid=(groups, 1, 1), block=(size, 1, 1))


def test_python_threads_launching_at_once_get_their_own_results(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    device = cpu.backend.load()
    kernel = scale_kernel(256, 128)      # 32768 threads: spread over the pool
    program = device.program(kernel.name,
                             device.compiler.compile(device.renderer.render(kernel)))
    wrong: list[int] = []

    def calls(seed: int) -> None:
        x = np.random.default_rng(seed).standard_normal(256 * 128).astype(np.float32)
        for _ in range(50):
            out = np.zeros_like(x)
            program([x.view(np.uint8), out.view(np.uint8)], [], kernel.grid, kernel.block)
            if not np.array_equal(out, x * np.float32(3) + np.float32(1)):
                wrong.append(seed)

    workers = [threading.Thread(target=calls, args=(seed,)) for seed in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not any(worker.is_alive() for worker in workers), "a launch never returned"
    assert wrong == [], f"wrong results from the callers seeded {sorted(set(wrong))}"


# Records which thread ran each chunk, and in which order the chunks were entered. The first
# chunk each thread enters waits (up to 2 s) for a second thread to enter one: neither thread
# can run a second chunk before the other has claimed its first.
OWNERS = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
static _Atomic int entered;
static double seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}
void reset(void) { atomic_store(&entered, 0); }
void chunk(void *context, int64_t index) {
  uint64_t *record = context;
  const int order = atomic_fetch_add(&entered, 1);
  record[2 * index] = (uint64_t)pthread_self();
  record[2 * index + 1] = (uint64_t)order;
  const double start = seconds();
  if (order < 2)
    while (atomic_load(&entered) < 2 && seconds() - start < 2)
      sched_yield();
}
"""

OWNERS_SCRIPT = """
import ctypes, sys
from portkit import cache
from portkit.reference_backends import cpu
from portkit.reference_backends.cpu import runtime

device = cpu.backend.load()
native = runtime._native(device.compiler)[0]
with cache.file_holding("cpu", device.compiler.compile(sys.argv[1]), ".so") as path:
    test = ctypes.CDLL(str(path))
record = (ctypes.c_uint64 * 8)()
native.pk_pool_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
for _ in range(20):
    test.reset()
    native.pk_pool_run(ctypes.cast(test.chunk, ctypes.c_void_p),
                       ctypes.cast(record, ctypes.c_void_p), 4)
    print(" ".join(str(r) for r in record))
"""


def test_each_thread_claims_from_its_own_range_first():
    # A launch's chunks are cut into one range per thread, so chunk k runs on the same core
    # launch after launch and the data it touched is still in that core's cache: of 4 chunks
    # on 2 threads the caller's first is chunk 0 and the worker's chunk 2. From one shared
    # counter, the worker took chunk 1 while the caller was in chunk 0.
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    ran = subprocess.run([sys.executable, "-c", OWNERS_SCRIPT, OWNERS], env=env, check=False,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    launches = [[int(r) for r in line.split()] for line in ran.stdout.splitlines()]
    assert len(launches) == 20
    firsts = []
    for record in launches:
        owner, order = record[0::2], record[1::2]
        first_two = [order.index(0), order.index(1)]
        if owner[first_two[0]] != owner[first_two[1]]:   # else the worker slept past 2 s
            firsts.append(sorted(first_two))
    assert len(firsts) >= 5, launches
    assert all(first == [0, 2] for first in firsts), firsts


# The CPUs each pool worker may run on (the threads named portkit-pool), after a launch.
PINNED = """
import os
import numpy as np
import pytest
from portkit.tensor import Tensor

Tensor(np.ones((512, 1000), np.float32), device="cpu").sum(axis=1).numpy()
for task in sorted(os.listdir("/proc/self/task")):
    with open(f"/proc/self/task/{task}/comm") as comm:
        if comm.read().strip() == "portkit-pool":
            print(" ".join(str(cpu) for cpu in sorted(os.sched_getaffinity(int(task)))))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are pinned on Linux")
def test_each_worker_is_pinned_to_a_cpu_of_its_own():
    # unpinned, the scheduler at times kept the worker on the caller's CPU for seconds: a
    # 2-thread call took as long as a 1-thread one, or 4x. Each worker gets one CPU of the
    # process's, in order, the first left to the caller; with fewer CPUs than threads, none.
    cpus = sorted(os.sched_getaffinity(0))
    for threads in (2, 3, len(cpus) + 1):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        ran = subprocess.run([sys.executable, "-c", PINNED], env=env, check=False,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stderr[-2000:]
        workers = [line.split() for line in ran.stdout.splitlines()]
        assert len(workers) == threads - 1
        if threads <= len(cpus):
            assert workers == [[str(cpu)] for cpu in cpus[1:threads]]
        else:
            assert workers == [[str(cpu) for cpu in cpus]] * (threads - 1)
