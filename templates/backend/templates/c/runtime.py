"""Runtime: device memory (Allocator), the toolchain (Compiler) and kernel launches (Program).

Starter: device memory is host memory (numpy arrays), the toolchain is the host C compiler,
and a launch calls the compiled shared object in this process. On your chip each class calls
its driver instead; keep the method signatures (portkit/abi/backend.py).
"""
import ctypes
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from portkit.abi import Allocator, BackendUnavailable, CompileError, Compiler, Program

# No -ffast-math: it changes float results. -ffp-contract=off: the ABI rounds MUL and ADD
# separately, so the compiler must not fuse them into one FMA.
FLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-ffp-contract=off")


class {{ cookiecutter.__title }}Allocator(Allocator):
    """Device memory. A buffer is whatever handle your driver gives; here, a numpy byte array."""

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def free(self, buffer: np.ndarray, nbytes: int) -> None:
        pass   # numpy frees the array with its last reference

    def copyin(self, buffer: np.ndarray, source: memoryview) -> None:
        data = np.frombuffer(source, np.uint8)
        buffer[:data.size] = data

    def copyout(self, destination: memoryview, buffer: np.ndarray) -> None:
        out = np.frombuffer(destination, np.uint8)
        out[:] = buffer[:out.size]


class {{ cookiecutter.__title }}Compiler(Compiler):
    """The toolchain: kernel source in, binary bytes out (portkit caches them on disk)."""

    def __init__(self, command: list[str]):
        self.command = command
        self.version = _run([*command, "--version"]).stdout.partition("\n")[0]
        # Whatever could change the binary for the same source belongs in the cache key.
        self.cache_key = f"{self.version}|{' '.join(FLAGS)}"

    def compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="{{ cookiecutter.name }}-") as folder:
            output = Path(folder) / "kernel.so"
            result = _run([*self.command, *FLAGS, "-x", "c", "-", "-o", str(output)], source)
            if result.returncode != 0:
                raise CompileError(f"{shlex.join(self.command)} rejected the kernel", source,
                                   result.stderr)
            return output.read_bytes()


class {{ cookiecutter.__title }}Program(Program):
    """One compiled kernel, loaded and ready to launch."""

    def __init__(self, name: str, binary: bytes):
        # The loader needs a file; once loaded, the file may go.
        with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as file:
            file.write(binary)
        try:
            self.launch = ctypes.CDLL(file.name).pk_launch
        finally:
            os.unlink(file.name)

    def __call__(self, buffers: list[np.ndarray], scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        pointers = (ctypes.c_void_p * len(buffers))(*(b.ctypes.data for b in buffers))
        ints = (ctypes.c_int32 * max(len(scalars), 1))(*scalars)
        start = time.perf_counter()
        self.launch(pointers, ints, (ctypes.c_int32 * 6)(*grid, *block))
        return time.perf_counter() - start if wait else None   # a launch here always waits


def find_compiler() -> list[str]:
    """$CC, else the first of cc, gcc, clang; BackendUnavailable (with the fix) if none."""
    command = shlex.split(os.environ.get("CC", "")) or [
        name for name in ("cc", "gcc", "clang") if shutil.which(name)][:1]
    if not command or not shutil.which(command[0]):
        raise BackendUnavailable("no C compiler found (looked at $CC, cc, gcc, clang)",
                                 "apt-get install gcc, or set CC")
    return command


def _run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
