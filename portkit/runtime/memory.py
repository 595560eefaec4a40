"""Device memory: buffers, and the pool that keeps freed memory for the next buffer of its size.

A training step allocates the same sizes every step; a freed buffer returns to its device's
pool and the next buffer of that byte size reuses it, skipping the driver.
"""
from __future__ import annotations

import gc
import sys
import threading
from collections import OrderedDict
from math import prod
from typing import Any

import numpy as np

from portkit import settings
from portkit.abi.backend import Allocator, HostAllocator
from portkit.abi.dtypes import DType
from portkit.abi.errors import PortkitError
from portkit.runtime import profile


class LaunchError(PortkitError, ValueError):
    """Buffers or scalars that do not match the kernel's arguments."""


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
        self.max_bytes = settings.megabytes("PORTKIT_POOL_MB") if max_bytes is None else max_bytes
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
            if len(self._free.get(nbytes, ())) >= self.PER_SIZE or nbytes > self.max_bytes:
                self.allocator.free(handle, nbytes)
                return
            # eviction may take this size's own older handles, and its emptied list with them
            while self.bytes + nbytes > self.max_bytes and self._free:
                self._evict_oldest()
            self._free.setdefault(nbytes, []).append(handle)
            self._free.move_to_end(nbytes)
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

    `borrowed`: memory that someone else owns, never taken from or given back to the pool:
    host bytes (an array imported by from_dlpack) as the buffer of a host-memory device, or
    the handle of a larger buffer of the same device (`within`).
    """

    __slots__ = ("__weakref__", "_allocator", "_pool", "dtype", "handle", "nbytes", "owned",
                 "size")

    def __init__(self, pool: BufferPool, dtype: DType, size: int,
                 borrowed: Any = None):
        self.dtype, self.size, self.nbytes = dtype, size, size * dtype.itemsize
        self._pool, self._allocator = pool, pool.allocator
        self.owned = borrowed is None
        self.handle: Any = pool.take(self.nbytes) if self.owned else borrowed

    def within(self, dtype: DType, size: int) -> Buffer:
        """This buffer, or a buffer over its first `size` elements of `dtype` (at most its
        bytes), which the caller keeps this one alive for: kernels and copies read and
        write a handle from its start (ABI `Allocator.copyout`)."""
        if dtype == self.dtype and size == self.size:
            return self
        assert size * dtype.itemsize <= self.nbytes
        return Buffer(self._pool, dtype, size, borrowed=self.handle)

    def copyin(self, array: np.ndarray) -> Buffer:
        """Copies a host array of the same dtype and size into the buffer; returns the buffer."""
        array = np.ascontiguousarray(array)
        if array.dtype != self.dtype.np or array.size != self.size:
            raise LaunchError(f"cannot copy a {array.dtype} array of {array.size} elements into "
                              f"a {self.dtype.name} buffer of {self.size}; pass "
                              f"array.astype({self.dtype.np.name!r}) of that size")
        with self._pool.lock:
            self._allocator.copyin(self.handle, array.reshape(-1).view(np.uint8).data)
        return self

    def numpy(self, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A new host array of the buffer's first elements in `shape` (default: all of them,
        1-D); waits for the device."""
        shape = (self.size,) if shape is None else shape
        if profile.current is not None:
            with profile.current.span("read-back", f"{self.size} x {self.dtype.name}"):
                return self._numpy(shape)
        return self._numpy(shape)

    def _numpy(self, shape: tuple[int, ...]) -> np.ndarray:
        with self._pool.lock:
            if isinstance(self._allocator, HostAllocator):   # the handle is the bytes
                return np.ndarray(shape, self.dtype.np, self.handle).copy()
            out = np.empty(self.size, self.dtype.np)
            self._allocator.copyout(out.view(np.uint8).data, self.handle)
        count = prod(shape)
        return out.reshape(shape) if count == self.size else out[:count].reshape(shape).copy()

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        # At interpreter exit a backend's modules may be gone, and the driver frees the memory.
        if handle is not None and self.owned and not sys.is_finalizing():
            self._pool.give(handle, self.nbytes)

