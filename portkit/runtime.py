"""One device, ready to use: buffers, compiled kernels (cached in memory and on disk), launches.

    rt = runtime.get("cpu")
    out, = rt.run(kernel, np.zeros(16, np.float32))

This is the one device pipeline: `prepare` (decompose what the device lacks, check the launch),
render, compile through the disk cache, make the program. The Tensor stack and conformance both
go through it. Freed buffers return to a per-device pool and the next buffer of that byte size
reuses them.

PORTKIT_DEBUG=2 prints one line per launch (name, grid, block, time); 3 adds the kernel's JSON
and 4 its rendered source, both at a kernel's first launch. A realize or a replay reads it and
PORTKIT_CHECK once (`launch_settings`) and hands them to each of its launches.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import os
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any, NamedTuple

import numpy as np

from portkit import backends, cache
from portkit.abi import dtypes
from portkit.abi.backend import Allocator, Capabilities, Device, HostAllocator, Program
from portkit.abi.dtypes import DType
from portkit.abi.errors import PortkitError
from portkit.abi.kernel import Kernel, scalar_words, validate
from portkit.abi.ops import COMPUTE


class LaunchError(PortkitError, ValueError):
    """Buffers or scalars that do not match the kernel's arguments."""


class OutOfBoundsError(LaunchError):
    """PORTKIT_CHECK found a LOAD or STORE outside its buffer (and did not perform it)."""


def setting(name: str) -> str:
    """`os.environ.get(name, "")`; launches get theirs once per realize (`launch_settings`)."""
    return os.environ.get(name, "")


def _env_mb(name: str, default: int) -> int:
    value = setting(name)
    return (int(value) if value.isdigit() else default) << 20


_MISSING = object()


class LRU:
    """A dict that keeps its `size` most recently used entries (get and set both use one);
    safe to share between threads. A look-up hashes its key once and compares it once."""

    def __init__(self, size: int):
        self.size = size
        self._guard = threading.RLock()
        # hash(key) -> (key, value), least recently used first. Graph keys are long nested
        # tuples: stored under their hash, a look-up hashes one once (in C, where a key object
        # with Python __hash__ and __eq__ took 0.24 us more), and moving the entry to the end
        # hashes an int. Two keys of one hash keep the later; the other is then a miss.
        self._entries: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key` (now the most recently used), or `default`."""
        digest = hash(key)
        with self._guard:
            found = self._entries.get(digest)
            if found is not None and found[0] == key:
                self._entries.move_to_end(digest)
                return found[1]
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        digest = hash(key)
        with self._guard:
            self._entries.pop(digest, None)     # so that it is the most recent
            self._entries[digest] = (key, value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def setdefault(self, key: Any, value: Any) -> Any:
        """The value of `key` if there is one, else `value`, stored; either is now the most
        recently used."""
        with self._guard:
            found = self.get(key, _MISSING)
            if found is not _MISSING:
                return found
            self[key] = value
            return value

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter([key for key, _ in self._entries.values()])

    def clear(self) -> None:
        """Forgets every entry."""
        with self._guard:
            self._entries.clear()


class BufferPool:
    """Device memory freed by buffers, kept for the next buffer of the same byte size.

    A training step allocates the same sizes every step; reusing them skips the driver. At
    most PER_SIZE handles per size and `max_bytes` in all (PORTKIT_POOL_MB, default 256) are
    kept; the least recently freed go first. `lock` is the device's: every call into the
    allocator holds it (see Runtime).
    """

    PER_SIZE = 8    # handles kept per byte size; more are freed at once

    def __init__(self, allocator: Allocator, lock: threading.RLock | None = None,
                 max_bytes: int | None = None):
        self.allocator = allocator
        self.lock = lock or threading.RLock()
        self.max_bytes = _env_mb("PORTKIT_POOL_MB", 256) if max_bytes is None else max_bytes
        self.bytes = 0     # held by the pool now
        self._free: OrderedDict[int, list[Any]] = OrderedDict()   # oldest size first

    def take(self, nbytes: int) -> Any:
        """A handle of `nbytes` bytes: a freed one if there is one, else a new allocation."""
        with self.lock:
            free = self._free.get(nbytes)
            while free:
                handle = free.pop()
                self.bytes -= nbytes
                if not gc.is_finalized(handle):     # see give
                    return handle
            return self.allocator.alloc(nbytes)

    def clear(self) -> None:
        """Frees every handle the pool holds."""
        with self.lock:
            while self._free:
                nbytes, handles = self._free.popitem(last=False)
                for handle in handles:
                    if not gc.is_finalized(handle):
                        self.allocator.free(handle, nbytes)
            self.bytes = 0

    def give(self, handle: Any, nbytes: int) -> None:
        """Keeps `handle` for reuse, or frees it when enough of its size are kept."""
        # When the garbage collector frees a cycle holding a Buffer, it may run the handle's
        # own finalizer (a driver object releasing its memory) first: such a handle is gone.
        if gc.is_finalized(handle):
            return
        with self.lock:
            kept = self._free.setdefault(nbytes, [])
            self._free.move_to_end(nbytes)
            if len(kept) >= self.PER_SIZE or nbytes > self.max_bytes:
                self.allocator.free(handle, nbytes)
                return
            while self.bytes + nbytes > self.max_bytes:
                self._evict_oldest()
            kept.append(handle)
            self.bytes += nbytes

    def _evict_oldest(self) -> None:
        size, handles = next(iter(self._free.items()))
        if handles:
            handle = handles.pop(0)
            self.bytes -= size
            if not gc.is_finalized(handle):
                self.allocator.free(handle, size)
        if not handles:
            del self._free[size]


class Buffer:
    """Device memory holding `size` elements of `dtype`; it returns to its pool when freed.

    `borrowed`: host bytes that someone else owns (an array imported by from_dlpack) used as
    the buffer of a host-memory device; never taken from or given back to the pool.
    """

    __slots__ = ("__weakref__", "_allocator", "_pool", "dtype", "handle", "nbytes", "owned",
                 "size")

    def __init__(self, pool: BufferPool, dtype: DType, size: int,
                 borrowed: np.ndarray | None = None):
        self.dtype, self.size, self.nbytes = dtype, size, size * dtype.itemsize
        self._pool, self._allocator = pool, pool.allocator
        self.owned = borrowed is None
        self.handle: Any = pool.take(self.nbytes) if self.owned else borrowed

    def copyin(self, array: np.ndarray) -> Buffer:
        """Copies a host array of the same dtype and size into the buffer; returns the buffer."""
        array = np.ascontiguousarray(array)
        if array.dtype != self.dtype.np or array.size != self.size:
            raise LaunchError(f"cannot copy a {array.dtype} array of {array.size} elements into "
                              f"a {self.dtype.name} buffer of {self.size}; pass "
                              f"array.astype({self.dtype.np.name!r}) of that size")
        with self._pool.lock:
            self._allocator.copyin(self.handle, memoryview(array.reshape(-1).view(np.uint8)))
        return self

    def numpy(self, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A new host array of the buffer's first elements in `shape` (default: all of them,
        1-D); waits for the device."""
        shape = (self.size,) if shape is None else shape
        with self._pool.lock:
            if isinstance(self._allocator, HostAllocator):   # the handle is the bytes
                return np.ndarray(shape, self.dtype.np, self.handle).copy()
            out = np.empty(self.size, self.dtype.np)
            self._allocator.copyout(memoryview(out.view(np.uint8)), self.handle)
        count = prod(shape)
        return out.reshape(shape) if count == self.size else out[:count].reshape(shape).copy()

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        # At interpreter exit a backend's modules may be gone, and the driver frees the memory.
        if handle is not None and self.owned and not sys.is_finalizing():
            self._pool.give(handle, self.nbytes)


@dataclass
class Compiled:
    """A kernel ready to launch: the kernel as run (after decomposition), its source, its
    program, and the seconds rendering and compiling took."""

    kernel: Kernel
    source: str
    program: Program
    seconds: float = field(default=0.0, compare=False)
    launched: bool = field(default=False, compare=False)
    # PORTKIT_CHECK=1: the bounds-checked build (codegen.check.Checked), its Compiled and its
    # fault buffer
    checked: tuple | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # What every launch checks and packs, read from the kernel once rather than per launch.
        kernel = self.kernel
        self.buffer_dtypes = tuple(p.dtype for p in kernel.params)
        self.var_dtypes = kernel.var_dtypes
        self.words_are_values = all(d == dtypes.int32 for d in self.var_dtypes)
        # scalar_words' packing, with its formats built once (VAR dtypes' numpy codes are
        # struct's): about 0.2 us a launch instead of 1
        self.packing = (struct.Struct("<" + "".join(d.np.char for d in self.var_dtypes)),
                        struct.Struct(f"<{len(self.var_dtypes)}i"))

    def words(self, scalars: tuple) -> list:
        """The scalar arguments' values as the 32-bit words the program takes."""
        if self.words_are_values:
            return list(scalars)
        values, words = self.packing
        try:
            return list(words.unpack(values.pack(*scalars)))
        except (struct.error, OverflowError):     # out of range: scalar_words wraps it
            return scalar_words(self.var_dtypes, scalars)


class Runtime:
    """A loaded device with its caches and buffer pool. Get one with `get(name)`.

    Thread-safe: every call into the device (allocate, copy, make a program, launch, wait)
    holds `device_lock`, because drivers are not (an OpenCL kernel's arguments are set, then
    enqueued: two threads interleave them; wgpu-core panicked on buffers freed by another
    thread). Compiling runs outside it, so threads still compile in parallel.
    """

    def __init__(self, name: str, device: Device):
        self.name, self.device = name, device
        self.device_lock = threading.RLock()   # re-entrant: a Buffer may be freed inside a call
        self.pool = BufferPool(device.allocator, self.device_lock)
        # Programs of the most recent kernels (PORTKIT_KERNEL_CACHE, default 1024): one per
        # distinct shape otherwise grows without bound; an evicted program is unloaded when
        # its last launch reference goes.
        self._compiled: LRU = LRU(kernel_cache_size())
        self._lock = threading.Lock()     # conformance compiles on several threads
        self.builds = 0     # kernels rendered and compiled (through the disk cache) so far

    @property
    def capabilities(self) -> Capabilities:
        """What the device declares it supports."""
        return self.device.capabilities

    def alloc(self, dtype: DType, size: int) -> Buffer:
        """A buffer of `size` elements of `dtype` (contents undefined until written)."""
        return Buffer(self.pool, dtype, size)

    def share(self, dtype: DType, memory: np.ndarray) -> Buffer | None:
        """A buffer over the caller's host bytes `memory` (no copy; the caller keeps it alive
        through the buffer), or None where this device's buffers are not host memory."""
        if not isinstance(self.device.allocator, HostAllocator) or memory.dtype != np.uint8:
            return None
        return Buffer(self.pool, dtype, memory.size // dtype.itemsize, borrowed=memory)

    def prepare(self, kernel: Kernel) -> Kernel:
        """`kernel` as this device runs it: ops it lacks decomposed, a name longer than the
        device takes shortened (its start and a hash), checked against its limits."""
        capabilities = self.capabilities
        longest = capabilities.max_name_length
        if longest is not None and len(kernel.name) > longest:
            digest = hashlib.sha256(kernel.name.encode()).hexdigest()[:12]
            kernel = dataclasses.replace(kernel, name=f"{kernel.name[:longest - 13]}_{digest}")
        if {n.op for n in kernel.nodes if n.op in COMPUTE} - capabilities.ops:
            from portkit.codegen.decompose import decompose

            kernel = decompose(kernel, capabilities.ops)
        validate(kernel)
        capabilities.check_launch(kernel)
        return kernel

    def build(self, kernel: Kernel, disk_cache: bool = True) -> Compiled:
        """Prepares, renders and compiles `kernel` now (through the disk cache unless told not
        to), bypassing the in-memory cache: for timing a compile."""
        start = time.perf_counter()
        with self._lock:
            self.builds += 1
        kernel = self.prepare(kernel)
        source = self.device.renderer.render(kernel)
        if disk_cache:
            binary = cache.compile_cached(self.name, self.device.compiler, source)
        else:
            binary = self.device.compiler.compile(source)
        with self.device_lock:
            program = self.device.program(kernel.name, binary)
        return Compiled(kernel, source, program, time.perf_counter() - start)

    def compile(self, kernel: Kernel) -> Compiled:
        """`build(kernel)`, once per kernel: later calls return the same Compiled."""
        # Keyed by the JSON form, not the Kernel: Kernel equality holds -0.0 == 0.0 and
        # NaN != NaN for CONST values, which would share or miss programs wrongly.
        key = kernel.to_json()
        with self._lock:
            compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.build(kernel)
            with self._lock:
                compiled = self._compiled.setdefault(key, compiled)
        return compiled

    def clear(self) -> None:
        """Forgets every compiled kernel and frees every pooled buffer."""
        with self._lock:
            self._compiled.clear()
        self.pool.clear()

    def launch(self, compiled: Compiled, buffers: list[Buffer], scalars: tuple = (),
               wait: bool = False, settings: Settings | None = None) -> float | None:
        """Runs `compiled` on its own grid and block; with `wait`, returns the seconds it took.
        `scalars` are the VARs' values (ints or floats), in argument order; `settings`: the
        caller's `launch_settings()`, read now if not given."""
        settings = settings or launch_settings()
        _check_arguments(compiled, buffers, scalars)
        words = compiled.words(scalars)
        if settings.check == "compiled" and self._checked(compiled) is not None:
            return self._launch_checked(compiled, buffers, words, wait, settings.debug)
        if settings.check:
            _check_bounds(compiled.kernel, buffers, words)
        return self._run(compiled, [b.handle for b in buffers], words, wait, settings.debug)

    def _checked(self, compiled: Compiled) -> tuple | None:
        """`compiled`'s bounds-checked build, its Compiled and its zeroed fault buffer, made
        once; None where the fault buffer would exceed the device's buffer limit (the
        interpreter checks then)."""
        if compiled.checked is None:
            from portkit.codegen.check import bounds_checked

            checked = bounds_checked(compiled.kernel)
            if len(checked.kernel.params) > self.capabilities.max_buffers:
                compiled.checked = (checked, None, None)
            else:
                fault = self.alloc(dtypes.int32, checked.fault_words)
                fault.copyin(np.zeros(checked.fault_words, np.int32))
                compiled.checked = (checked, self.compile(checked.kernel), fault)
        return compiled.checked if compiled.checked[1] is not None else None

    def _launch_checked(self, compiled: Compiled, buffers: list[Buffer], words: list,
                        wait: bool, level: int) -> float | None:
        checked, program, fault = compiled.checked
        sizes = [b.size for b in buffers]
        # The fault buffer stays zero until an access is out of bounds; it is the kernel's, so
        # the launch and its reading hold the device's lock together.
        with self.device_lock:
            seconds = self._run(program, [b.handle for b in buffers] + [fault.handle],
                                sizes + words, wait, level)
            compiled.launched = True
            found = checked.fault(fault.numpy(), sizes)
            if found is not None:
                fault.copyin(np.zeros(checked.fault_words, np.int32))
        if found is not None:
            raise OutOfBoundsError(f"{found.message(compiled.kernel)} (PORTKIT_CHECK=1 skipped "
                                   f"it); the buffers hold {sizes} elements: fix the kernel's "
                                   "index or the buffer sizes")
        return seconds

    def launch_again(self, compiled: Compiled, buffers: list[Buffer], scalars: tuple,
                     words: list | None = None, settings: Settings | None = None) -> None:
        """Runs `compiled` again on buffers and scalars of the kinds an earlier `launch` of it
        checked (a replay: schedule.py's of a graph seen before, portkit.jit's): no argument
        checks and no waiting. `words`: the scalars already packed (`compiled.words`);
        `settings`: the replay's `launch_settings()`. While PORTKIT_DEBUG or PORTKIT_CHECK is
        set it is `launch`, so each replayed launch is printed or checked."""
        settings = settings or launch_settings()
        if settings.debug or settings.check:
            self.launch(compiled, buffers, scalars, settings=settings)
            return
        words = compiled.words(scalars) if words is None else words
        self._run(compiled, [b.handle for b in buffers], words, False, 0)

    def _run(self, compiled: Compiled, handles: list, words: list, wait: bool,
             level: int) -> float | None:
        # the one place a program runs: under the device's lock, timed for PORTKIT_DEBUG>=2
        kernel = compiled.kernel
        with self.device_lock:
            seconds = compiled.program(handles, words, kernel.grid, kernel.block,
                                       wait=wait or level >= 2)
        if level >= 2:
            print_launch(compiled, seconds, level)
        compiled.launched = True
        return seconds if wait else None

    def run(self, kernel: Kernel, *arrays: np.ndarray, scalars: tuple = ()
            ) -> list[np.ndarray]:
        """Uploads `arrays` (one per PARAM, in order), launches, returns every param's array."""
        compiled = self.compile(kernel)
        params = compiled.kernel.params
        if len(arrays) != len(params):
            raise LaunchError(f"kernel {kernel.name!r} takes {len(params)} buffers, "
                              f"got {len(arrays)} arrays")
        arrays = tuple(np.asarray(a) for a in arrays)
        buffers = [self.alloc(p.dtype, a.size).copyin(a) for p, a in zip(params, arrays)]
        self.launch(compiled, buffers, scalars, wait=True)
        return [b.numpy().reshape(a.shape) for b, a in zip(buffers, arrays)]

    def synchronize(self) -> None:
        """Waits until every launched kernel has finished."""
        with self.device_lock:
            self.device.synchronize()


def kernel_cache_size() -> int:
    """How many compiled kernels a runtime keeps: PORTKIT_KERNEL_CACHE (default 1024)."""
    value = setting("PORTKIT_KERNEL_CACHE")
    return int(value) if value.isdigit() and int(value) > 0 else 1024


_on_clear: list[Callable[[], None]] = []


def on_clear(forget: Callable[[], None]) -> None:
    """Registers `forget`, called by `clear()`: layers above keep caches of their own."""
    _on_clear.append(forget)


def clear() -> None:
    """Frees what portkit holds in memory: every runtime's compiled kernels and pooled
    buffers, and the caches registered through `on_clear` (the scheduler's lowered kernels).
    Tensors already realized keep their buffers."""
    for forget in _on_clear:
        forget()
    for found in list(_runtimes.values()):
        found.clear()


def default_device() -> str:
    """The device a Tensor gets when none is named: $PORTKIT_DEVICE, else "cpu"."""
    return setting("PORTKIT_DEVICE") or "cpu"


_runtimes: dict[str, Runtime] = {}


def get(name: str | None = None) -> Runtime:
    """The runtime of backend `name` (default: `default_device()`), made once per name."""
    name = name or default_device()
    found = _runtimes.get(name)
    if found is None:
        found = _runtimes.setdefault(name, Runtime(name, backends.load(name)))
    return found


def register(runtime: Runtime) -> Runtime:
    """Makes `get(runtime.name)` return `runtime`: a device handed in directly (a backend under
    test, not loaded by name) becomes reachable by name. Raises ValueError if that name is
    already taken by another runtime."""
    found = _runtimes.setdefault(runtime.name, runtime)
    if found is not runtime:
        raise ValueError(f"a runtime named {runtime.name!r} exists already; pick another name")
    return runtime


_DEBUG_WORDS = {"": 0, "0": 0, "no": 0, "false": 0, "off": 0, "yes": 1, "true": 1, "on": 1}


def debug_level() -> int:
    """PORTKIT_DEBUG as a level 0-4: digits, or yes/true/on (1) and no/false/off (0); anything
    else is a ValueError naming the accepted values (`portkit` reports it and exits 2)."""
    return _debug_level(setting("PORTKIT_DEBUG"))


@functools.lru_cache(maxsize=16)
def _debug_level(raw: str) -> int:
    value = raw.strip().lower()
    if value.isdigit():
        return int(value)
    if value not in _DEBUG_WORDS:
        raise ValueError(f"PORTKIT_DEBUG={value!r} is not a level: use 0-4, or yes/no")
    return _DEBUG_WORDS[value]


_CHECK_WORDS = {**dict.fromkeys(("", "0", "no", "false", "off"), ""),
                **dict.fromkeys(("1", "yes", "true", "on", "compiled"), "compiled"),
                "interpreter": "interpreter"}


def check_mode(raw: str | None = None) -> str:
    """PORTKIT_CHECK: "" (off), "compiled" (1: every launch runs its bounds-checked build,
    codegen/check.py, natively: an out-of-bounds LOAD or STORE is skipped and raises
    OutOfBoundsError after the launch) or "interpreter" (every launch first runs in the ABI
    interpreter on copies of its buffers, and the device runs nothing out of bounds; slow).
    Anything else is a ValueError naming the accepted values. `raw`: its value, if read."""
    raw = setting("PORTKIT_CHECK") if raw is None else raw
    if not raw:
        return ""
    mode = _CHECK_WORDS.get(raw.strip().lower())
    if mode is None:
        raise ValueError(f"PORTKIT_CHECK={raw!r} is not a mode: use 1 (compiled), "
                         "interpreter, or 0")
    return mode


class Settings(NamedTuple):
    """What every launch of a realize or a replay obeys, read once for all of them."""

    debug: int      # PORTKIT_DEBUG's level
    check: str      # PORTKIT_CHECK's mode


_QUIET = Settings(0, "")
# Whether either is set is asked of the dict behind os.environ (CPython's, by encoded name; what
# os.environ[...] = ... and monkeypatch.setenv update) in 50 ns: os.environ.get takes 0.6 us.
_ENVIRON, _KEY = ((os.environ._data, os.environ.encodekey) if hasattr(os.environ, "_data")
                  else (os.environ, str))
_DEBUG, _CHECK = _KEY("PORTKIT_DEBUG"), _KEY("PORTKIT_CHECK")


def launch_settings() -> Settings:
    """PORTKIT_DEBUG and PORTKIT_CHECK now (ValueError for a value neither accepts)."""
    if _DEBUG not in _ENVIRON and _CHECK not in _ENVIRON:
        return _QUIET
    return Settings(_debug_level(setting("PORTKIT_DEBUG")), check_mode())


def _check_bounds(kernel: Kernel, buffers: list[Buffer], words: list[int]) -> None:
    from portkit.abi.interpreter import OutOfBounds, run

    try:
        run(kernel, [b.numpy() for b in buffers], words)
    except OutOfBounds as error:
        raise OutOfBoundsError(f"{error} (PORTKIT_CHECK stopped the launch); the buffers "
                               f"hold {[b.size for b in buffers]} elements: fix the kernel's "
                               "index or the buffer sizes") from None


def _check_arguments(compiled: Compiled, buffers: list[Buffer], scalars: tuple) -> None:
    wanted = compiled.buffer_dtypes
    if len(buffers) != len(wanted) or len(scalars) != len(compiled.var_dtypes):
        kernel = compiled.kernel
        raise LaunchError(f"kernel {kernel.name!r} takes {len(wanted)} buffers and scalars "
                          f"{kernel.vars}, got {len(buffers)} buffers and {len(scalars)} scalars")
    for position, (dtype, buffer) in enumerate(zip(wanted, buffers)):
        if buffer.dtype != dtype:
            raise LaunchError(f"kernel {compiled.kernel.name!r}: buffer {position} must hold "
                              f"{dtype.name}, got {buffer.dtype.name}")


def print_launch(compiled: Compiled, seconds: float | None, level: int) -> None:
    """PORTKIT_DEBUG's line for one launch (level 2), with the kernel's JSON (3) and source
    (4) at its first launch; conformance, which launches programs itself, prints it too."""
    kernel = compiled.kernel
    print(f"portkit: {kernel.name:<28} grid {kernel.grid} block {kernel.block} "
          f"{(seconds or 0.0) * 1e3:9.3f} ms", file=sys.stderr)
    if not compiled.launched and level >= 3:
        print(kernel.to_json(), file=sys.stderr)
        if level >= 4:
            print(compiled.source, file=sys.stderr)
