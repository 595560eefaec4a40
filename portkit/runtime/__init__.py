"""The runtime: devices ready to use, their memory, their compiled programs and their launches.

    rt = runtime.get("cpu")
    out, = rt.run(kernel, np.zeros(16, np.float32))

- `memory`: buffers, and the pool that keeps freed device memory for reuse;
- `programs`: compiled programs, and the LRU cache that keeps them;
- `device`: `Runtime`, one device's pipeline (decompose, check, render, compile through the
  disk cache, program) and its launches: `run_program` is the one place a program runs, `time`
  the one kernel timer, `compile_all` the one way to compile many kernels at once;
- `profile`: a Chrome/Perfetto trace of launches, compiles, realizes and read-backs;
- `progress`: how far `compile_all` has come, reported to a hook and shown as a bar or lines;
- `registry`: the runtimes of this process by name, and `clear()`, which empties every
  in-memory kernel cache (layers above register theirs through `on_clear`).
"""
from portkit.runtime import profile, progress
from portkit.runtime.device import (
    OutOfBoundsError,
    Runtime,
    kernel_cache_size,
    print_launch,
)
from portkit.runtime.memory import Buffer, BufferPool, LaunchError
from portkit.runtime.programs import LRU, Compiled
from portkit.runtime.registry import (
    clear,
    default_device,
    device_name,
    get,
    on_clear,
    register,
)

__all__ = ["LRU", "Buffer", "BufferPool", "Compiled", "LaunchError", "OutOfBoundsError",
           "Runtime", "clear", "default_device", "device_name", "get", "kernel_cache_size", "on_clear",
           "print_launch", "profile", "progress", "register"]
