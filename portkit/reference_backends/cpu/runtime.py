"""Runtime: host memory (Allocator), the C compiler (Compiler) and in-process launches (Program).

Each kernel becomes a shared object with one entry point, `pk_launch_<kernel function>`, that
cffi calls with the buffers as pointers; `compile_batch` builds many kernels into one shared
object with one compiler process, each program finding its own entry point by its kernel's
name. A launch large enough runs on every core through the runtime's thread pool
(`pk_pool_run`, plain C and pthreads), which each kernel library is handed when it is loaded
(`pk_use_pool`); it has `threads()` threads, OMP_NUM_THREADS if set, else the CPUs the process
may run on. A Batch of launches is one call into a small C loop (`pk_run_batch`) that calls
each kernel's entry point in turn; the pool and the loop are one library, built once. Buffers
are host memory (numpy arrays), so copies are memcpy and launches are synchronous.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import cast

import cffi
import numpy as np

from portkit import cache, settings
from portkit.abi.backend import Batch, Compiler, HostAllocator, Launch, Program
from portkit.abi.errors import BackendUnavailable, CompileError
from portkit.codegen.cstyle import compile_joined
from portkit.reference_backends.cpu.renderer import entry_point

# No -ffast-math: it changes float results and flushes denormals. fp-contract=off keeps gcc
# from fusing a separate MUL and ADD into one FMA (the ABI rounds each op). -mtune=generic:
# clang 14 tunes an AMD EPYC's -march=native for znver3, whose loop strength reduction took
# 0.5 s of a 5 kB elementwise kernel's 0.8 s compile (0.25 s tuned generic, the instructions
# the same -march allows).
FLAGS = ("-O2", "-march=native", "-mtune=generic", "-fPIC", "-shared", "-std=gnu11",
         "-fno-math-errno", "-ffp-contract=off", "-Wno-unknown-pragmas")
FIX = "apt-get install clang (or gcc), or set PORTKIT_CC"
# clang and gcc vectorize with 256-bit registers on AVX-512 CPUs unless told otherwise; the
# packed matmul (codegen/pack.py) keeps 8 x 32 float32 in sixteen 512-bit registers, and runs
# at 2x the speed of its 256-bit code on a 2-core AVX-512 Xeon (and spills there).
WIDE_VECTORS = ("-mprefer-vector-width=512",)

_ffi = cffi.FFI()
_LAUNCH = "void (*)(void **buffers, const int32_t *scalars, const int32_t *dims)"


# Each buffer's C pointer, made when the allocator makes the buffer: cffi's from_buffer costs
# about 0.3 us a buffer, at every launch otherwise. By id, since numpy arrays compare by value;
# an entry holds its buffer, so the id of a live buffer here is that buffer's own.
_pointers: dict[int, object] = {}


class CPUAllocator(HostAllocator):
    """The CPU's buffers are host memory: the ABI's HostAllocator, and each one's C pointer."""

    def alloc(self, nbytes: int) -> np.ndarray:
        buffer = super().alloc(nbytes)
        _pointers[id(buffer)] = _ffi.from_buffer(buffer)
        return buffer

    def free(self, buffer: np.ndarray, nbytes: int) -> None:
        _pointers.pop(id(buffer), None)


class CPUCompiler(Compiler):
    """Runs the C compiler on a kernel's source and returns the shared object's bytes."""

    def __init__(self, command: list[str]):
        self.command = command
        self.flags = FLAGS + (WIDE_VECTORS if "avx512f" in cpu_flags() else ())
        self.version = _run([*command, "--version"]).stdout.splitlines()[0]
        # -march=native code only runs on the CPU type that built it, so the CPU is in the key;
        # and the whole command, so PORTKIT_CC="gcc -fsanitize=address" is its own build.
        self.cache_key = "|".join((self.version, shlex.join(command), " ".join(self.flags),
                                   cpu_model()))

    def compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="portkit-cc-") as folder:
            output = Path(folder) / "kernel.so"
            result = _run([*self.command, *self.flags, "-x", "c", "-", "-o", str(output)],
                          source)
            if result.returncode != 0:
                raise CompileError(f"{shlex.join(self.command)} rejected the kernel "
                                   "(the C source is in .source)", source, result.stderr)
            return output.read_bytes()

    def compile_batch(self, sources: list[str]) -> list[bytes | CompileError]:
        """All `sources` as one C file, one compiler process, one shared object
        (cstyle.compile_joined): its binary is every source's and each program finds its
        kernel's entry point by name. Raises CompileError if the build fails."""
        return compile_joined(self.compile, sources)


class CPUProgram(Program):
    """A loaded shared object; calling it runs the whole grid before returning."""

    def __init__(self, name: str, binary: bytes, compiler: CPUCompiler):
        self.name = name
        # dlopen needs a file. Its name is the hash of its bytes (checked before loading): the
        # loader reuses a library already open under the same name, which is then the same code.
        # Never closed (ctypes closes none): other programs and batches point into it.
        with cache.file_holding("cpu", binary, ".so") as path:
            self.library = ctypes.CDLL(str(path))
        _use_pool(self.library, compiler)
        entry = getattr(self.library, entry_point(name))
        self.launch = _ffi.cast(_LAUNCH, ctypes.cast(entry, ctypes.c_void_p).value)
        # The C arrays of the last scalars and dims: a kernel is launched again and again with
        # the same ones, and making an array costs about as much as the call.
        self.scalars: tuple[list, object] = ([], _ffi.NULL)
        self.dims: tuple[tuple, object] = ((), _ffi.NULL)

    def __call__(self, buffers: list[np.ndarray], scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        known = _pointers.get      # memory the allocator did not make has none kept
        pointers = _ffi.new("void *[]", [known(id(b)) or _ffi.from_buffer(b) for b in buffers])
        last_scalars, last_dims = self.scalars, self.dims
        if scalars != last_scalars[0]:
            last_scalars = self.scalars = (list(scalars), _ffi.new("int32_t[]", list(scalars)))
        if (grid, block) != last_dims[0]:
            last_dims = self.dims = ((grid, block), _ffi.new("int32_t[6]", [*grid, *block]))
        start = time.perf_counter()
        self.launch(pointers, last_scalars[1], last_dims[1])
        return time.perf_counter() - start if wait else None


# The runtime's own C, one small library built once: the thread pool that spreads a launch
# over cores, and the loop that replays a batch.
#
# The pool: a launch (pk_pool_run) publishes a job, a function and a context, and the count of
# its chunks, cut into one contiguous range per thread (the caller's first, then each worker's).
# A thread claims chunks of its own range one at a time from the range's atomic counter, then
# those left in the others' ranges. So a launch's chunk k runs on the same core as chunk k of
# the launch before whenever every thread is awake: a recurrence's weights (an LSTM step's
# matrix-vector product) and an elementwise chain's rows stay in that core's L2. The caller
# starts at once and then waits only for the chunks a worker has claimed, so a worker that is
# asleep, or descheduled because other threads share its core, never delays a launch: the
# others claim its range. Idle workers poll for SPIN_NS, calling sched_yield between looks so
# that a poller never keeps a thread that has work (the caller, another library's) off its
# core, then look every NAP_NS for DROWSY_NS, then sleep on a condition variable, which a
# launch signals without waiting for anyone to wake. The naps keep a worker's core at hand:
# in a VM, a worker blocked on the condition variable halts its virtual CPU, and woken by the
# first launch of a model's call after 0.3 s idle it joined milliseconds late (the zoo's
# detection head on 2 threads 17.5 ms a call after idle, 11.4 back to back; 12.0 with the
# naps), at about 5% of a core for the second after the last launch (15 ms of CPU over 0.3 s
# idle; onnxruntime's workers spin about as long after each call). On Linux each worker is
# pinned to a CPU of its own, the caller's thread left free: unpinned, the scheduler at times
# kept the worker on the caller's CPU for seconds (MobileNetV3 on 2 threads, 40 calls 0.3 s
# apart: a median of 3.8 ms, 12 ms in another process; pinned 3.1-3.3). The pool runs one job
# at a time; a launch that finds it busy (another Python thread's) runs its chunks on its own
# thread.
#
# Each range's counter holds the job's number in its high 32 bits and the next chunk in the
# low 32: a thread claims chunk k of job j by a compare-and-swap from (j, k) to (j, k + 1). A
# launch first moves every counter to its job, then writes the function, context and range
# ends, then publishes the job's number; a swap that succeeds saw its counter still at job j,
# so the fields it read before were job j's, and a thread still holding job j - 1 never runs a
# chunk of job j with j - 1's function.
_NATIVE = r"""#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define PK_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define PK_PAUSE() __asm__ __volatile__("yield")
#else
#define PK_PAUSE() ((void)0)
#endif
#define SPIN_NS 100000
#define NAP_NS 250000
#define DROWSY_NS 1000000000LL
#define MAX_THREADS 256

typedef void (*pk_chunk_fn)(void *context, int64_t index);

static struct {
  pthread_mutex_t busy;              /* held by the launch whose job the pool runs */
  pthread_mutex_t lock;              /* with `wake`: where idle workers sleep */
  pthread_cond_t wake;
  _Atomic uint64_t job;              /* the running job's number << 32 */
  _Atomic uint64_t claim[MAX_THREADS];  /* per range: job << 32 | next chunk to claim */
  _Atomic int64_t end[MAX_THREADS];  /* per range: one past its last chunk */
  _Atomic(pk_chunk_fn) chunk;        /* the job: chunk(context, i) for i in [0, count) */
  _Atomic(void *) context;
  _Atomic int64_t done;              /* chunks run to the end, by anyone */
  atomic_int sleeping, held;         /* held: workers claim nothing (pk_pool_hold, a test's) */
  int workers;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Runs chunks of `job` until none is left, its own range's first (thread 0 is the caller);
   returns at once if the pool has moved past it. */
static void claim_chunks(uint64_t job, int self) {
  const int ranges = pool.workers + 1;
  for (int step = 0; step < ranges; step++) {
    const int range = (self + step) % ranges;
    uint64_t at = atomic_load(&pool.claim[range]);
    for (;;) {
      if (at >> 32 != job >> 32)
        return;
      /* Read before the swap: if the swap succeeds, the job was still `job`, so these are its. */
      const pk_chunk_fn chunk = atomic_load(&pool.chunk);
      void *const context = atomic_load(&pool.context);
      if ((int64_t)(at & 0xffffffff) >= atomic_load(&pool.end[range]))
        break;
      if (atomic_compare_exchange_weak(&pool.claim[range], &at, at + 1)) {
        chunk(context, (int64_t)(at & 0xffffffff));
        atomic_fetch_add(&pool.done, 1);
        at = atomic_load(&pool.claim[range]);
      }
    }
  }
}

static int waiting(uint64_t seen) {
  return atomic_load(&pool.job) == seen || atomic_load(&pool.held);
}

static void *worker(void *slot) {
  const int self = (int)(intptr_t)slot;
  uint64_t seen = atomic_load(&pool.job);
  for (;;) {
    const int64_t until = now_ns() + SPIN_NS;
    while (waiting(seen) && now_ns() < until)
      sched_yield();
    const struct timespec nap = {0, NAP_NS};
    const int64_t drowsy = now_ns() + DROWSY_NS;
    while (waiting(seen) && now_ns() < drowsy)
      nanosleep(&nap, NULL);
    if (waiting(seen)) {
      pthread_mutex_lock(&pool.lock);
      atomic_fetch_add(&pool.sleeping, 1);
      while (waiting(seen))   /* pk_pool_run stores the job, then reads `sleeping` */
        pthread_cond_wait(&pool.wake, &pool.lock);
      atomic_fetch_sub(&pool.sleeping, 1);
      pthread_mutex_unlock(&pool.lock);
    }
    seen = atomic_load(&pool.job);
    claim_chunks(seen, self);
  }
  return NULL;
}

/* Never blocks: a worker holding the lock is on its way to sleep or to work, and if it sleeps
   through this job, the next launch wakes it. */
static void wake_workers(void) {
  if (atomic_load(&pool.sleeping) && pthread_mutex_trylock(&pool.lock) == 0) {
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
  }
}

/* A forked child has none of its parent's workers: its launches run on its own thread. */
static void forget_workers(void) { pool.workers = 0; }

/* Linux: worker `slot` runs only on the slot-th CPU this process may use (the caller's thread,
   never pinned, is left the first), where there are CPUs enough for every thread. */
static void pin(pthread_attr_t *attr, int slot, int threads) {
#ifdef __linux__
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < threads)
    return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &allowed) && seen++ == slot) {
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      pthread_attr_setaffinity_np(attr, sizeof one, &one);
      return;
    }
#else
  (void)attr, (void)slot, (void)threads;
#endif
}

/* Starts threads - 1 workers (the caller of pk_pool_run is the last thread); once. */
void pk_pool_start(int32_t threads) {
  static atomic_flag started = ATOMIC_FLAG_INIT;
  if (atomic_flag_test_and_set(&started))
    return;
  pthread_atfork(NULL, NULL, forget_workers);
  /* a workgroup's LOCAL memory is an array on its thread's stack (up to 1 MiB): 8 MiB each,
     as Linux's main thread has, where macOS gives a new thread 512 KiB */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 8 << 20);
  for (int32_t i = 1; i < threads && i < MAX_THREADS; i++) {
    pthread_t thread;
    pin(&attr, pool.workers + 1, threads);
    /* a worker's slot, its range, is fixed before it starts: workers counts those started */
    if (pthread_create(&thread, &attr, worker, (void *)(intptr_t)(pool.workers + 1)) != 0)
      continue;
#ifdef __linux__
    pthread_setname_np(thread, "portkit-pool");   /* by its creator: it may not have run yet */
#endif
    if (pthread_detach(thread) == 0)
      pool.workers++;
  }
  pthread_attr_destroy(&attr);
}

/* chunk(context, i) for every i in [0, count), on the pool's threads and this one. */
void pk_pool_run(pk_chunk_fn chunk, void *context, int64_t count) {
  if (pool.workers == 0 || count > 0xffffffff || pthread_mutex_trylock(&pool.busy) != 0) {
    for (int64_t i = 0; i < count; i++)
      chunk(context, i);
    return;
  }
  const int ranges = pool.workers + 1;
  const uint64_t job = atomic_load(&pool.job) + ((uint64_t)1 << 32);
  for (int range = 0; range < ranges; range++)   /* first: no swap of the last job succeeds */
    atomic_store(&pool.claim[range], job | (uint64_t)(count * range / ranges));
  for (int range = 0; range < ranges; range++)
    atomic_store(&pool.end[range], count * (range + 1) / ranges);
  atomic_store(&pool.chunk, chunk);
  atomic_store(&pool.context, context);
  atomic_store(&pool.done, 0);
  atomic_store(&pool.job, job);
  wake_workers();
  claim_chunks(job, 0);
  for (int spins = 0; atomic_load(&pool.done) < count; spins++)
    if (spins < 1000)
      PK_PAUSE();
    else
      sched_yield();
  pthread_mutex_unlock(&pool.busy);
}

/* Tests: how many workers are blocked on the condition variable. */
int32_t pk_pool_sleeping(void) { return atomic_load(&pool.sleeping); }

/* Tests: while held, workers claim nothing, as if they never woke. */
void pk_pool_hold(int32_t held) {
  atomic_store(&pool.held, held);
  pthread_mutex_lock(&pool.lock);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);
}

/* Every launch of a batch in one native call: each kernel's entry point on its own slices of
   flat arrays of buffer pointers, scalar words and dims (grid, block). */
typedef void (*pk_kernel)(void **, const int32_t *, const int32_t *);
void pk_run_batch(int32_t count, void **kernels, void **buffers, const int32_t *buffer_at,
                  const int32_t *scalars, const int32_t *scalar_at, const int32_t *dims) {
  for (int32_t i = 0; i < count; i++)
    ((pk_kernel)kernels[i])(buffers + buffer_at[i], scalars + scalar_at[i], dims + 6 * i);
}
"""
_RUN_BATCH = ("void (*)(int32_t, void **, void **, const int32_t *, const int32_t *, "
              "const int32_t *, const int32_t *)")


def threads() -> int:
    """How many threads a launch runs on: OMP_NUM_THREADS where set (the benchmarks set it to
    1, for every library at once), else the CPUs this process may run on."""
    count = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(count) if count.isdigit() and int(count) > 0 else len(os.sched_getaffinity(0))


def build_native(compiler: CPUCompiler) -> bytes:
    """The runtime's library (the pool and the batch loop), through the disk cache."""
    return cache.compile_cached("cpu", compiler, _NATIVE)


@functools.cache
def _native(compiler: CPUCompiler) -> tuple[ctypes.CDLL, int]:
    """The runtime's library, loaded once per compiler, and the threads its pool started
    with (`threads()` when first loaded)."""
    with cache.file_holding("cpu", build_native(compiler), ".so") as path:
        library = ctypes.CDLL(str(path))
    count = threads()
    library.pk_pool_start(count)
    return library, count


_pooled: set[int] = set()   # the handles of the kernel libraries given the pool


def _use_pool(library: ctypes.CDLL, compiler: CPUCompiler) -> None:
    """Gives a kernel library the pool (its pk_use_pool), once per library; with one thread
    none, and its launches run on their caller's thread."""
    native, count = _native(compiler)
    if library._handle in _pooled or count == 1:
        return
    _pooled.add(library._handle)
    library.pk_use_pool(ctypes.cast(native.pk_pool_run, ctypes.c_void_p), count)


class CPUBatch(Batch):
    """Launches replayed by one native call (`pk_run_batch`); a replaced buffer or scalar
    words are written into the C arrays it reads."""

    def __init__(self, compiler: CPUCompiler, launches: list[Launch]):
        self.library = _native(compiler)[0]
        self.run = _ffi.cast(_RUN_BATCH, ctypes.cast(self.library.pk_run_batch,
                                                     ctypes.c_void_p).value)
        self.count = len(launches)
        programs = [cast(CPUProgram, launch.program) for launch in launches]
        self.kernels = _ffi.new("void *[]", [_ffi.cast("void *", p.launch) for p in programs])
        self.buffer_at = [0]
        self.scalar_at = [0]
        for launch in launches:
            self.buffer_at.append(self.buffer_at[-1] + len(launch.buffers))
            self.scalar_at.append(self.scalar_at[-1] + len(launch.scalars))
        self.pointers = _ffi.new("void *[]", max(1, self.buffer_at[-1]))
        self.held: list = [None] * self.buffer_at[-1]   # keeps each pointer's memory alive
        self.words = _ffi.new("int32_t[]", [w for launch in launches for w in launch.scalars]
                              or [0])
        self.c_buffer_at = _ffi.new("int32_t[]", self.buffer_at)
        self.c_scalar_at = _ffi.new("int32_t[]", self.scalar_at)
        self.dims = _ffi.new("int32_t[]", [d for launch in launches
                                           for d in (*launch.grid, *launch.block)] or [0])
        for index, launch in enumerate(launches):
            for position, buffer in enumerate(launch.buffers):
                self._set(index, position, buffer)

    def _set(self, launch: int, position: int, buffer: np.ndarray) -> None:
        at = self.buffer_at[launch] + position
        self.held[at] = self.pointers[at] = _pointers.get(id(buffer)) or _ffi.from_buffer(buffer)

    def __call__(self, buffers=(), scalars=(), wait: bool = False) -> float | None:
        for launch, position, buffer in buffers:
            self._set(launch, position, buffer)
        for launch, words in scalars:
            at = self.scalar_at[launch]
            self.words[at:at + len(words)] = words
        start = time.perf_counter()
        self.run(self.count, self.kernels, self.pointers, self.c_buffer_at, self.words,
                 self.c_scalar_at, self.dims)
        return time.perf_counter() - start if wait else None


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo, e.g. "avx512f"); empty elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def find_compiler() -> list[str]:
    """The compiler command: $PORTKIT_CC, else clang, else gcc; BackendUnavailable if none."""
    override = settings.read("PORTKIT_CC")
    if override:
        command = shlex.split(override)
        if not shutil.which(command[0]):
            raise BackendUnavailable(f"no C compiler found: PORTKIT_CC={override!r} is not an "
                                     "executable", FIX)
        return command
    for name in ("clang", "gcc", "cc"):
        if shutil.which(name):
            return [name]
    raise BackendUnavailable("no C compiler found (looked for clang, gcc, cc)", FIX)


def _run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=False, input=stdin, capture_output=True, text=True)
