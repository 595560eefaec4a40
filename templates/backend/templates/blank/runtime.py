"""Runtime: device memory (Allocator), the toolchain (Compiler) and kernel launches (Program).

Starter: blank. Every method raises NotImplementedError that says what to write and which
section of portkit's docs/porting.md explains it; `portkit conform` shows which ones
are still missing. The signatures are the ABI's (portkit/abi/backend.py).
"""
from typing import Any

from portkit.abi import Allocator, Compiler, Program

GUIDE = "docs/porting.md in the portkit repository"


def _todo(part: object, method: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"{type(part).__name__}.{method} is not written yet: {what}; "
                               f"read {GUIDE}, section 'Tier 1: runtime'")


class {{ cookiecutter.__title }}Allocator(Allocator):
    """Device memory: buffers are whatever handle your driver gives."""

    def alloc(self, nbytes: int) -> Any:
        raise _todo(self, "alloc", "allocate nbytes of device memory and return its handle "
                    "(0 bytes must work too)")

    def free(self, buffer: Any, nbytes: int) -> None:
        raise _todo(self, "free", "release a buffer that alloc returned")

    def copyin(self, buffer: Any, source: memoryview) -> None:
        raise _todo(self, "copyin", "copy all of source (host bytes) to the start of buffer")

    def copyout(self, destination: memoryview, buffer: Any) -> None:
        raise _todo(self, "copyout", "fill destination (host bytes) from the start of buffer, "
                    "once the work launched before has finished")


class {{ cookiecutter.__title }}Compiler(Compiler):
    """The toolchain: kernel source in, binary bytes out (portkit caches them on disk)."""

    def compile(self, source: str) -> bytes:
        raise _todo(self, "compile", "build the renderer's source and return the binary's "
                    "bytes (raise CompileError with the compiler's log when it fails)")


class {{ cookiecutter.__title }}Program(Program):
    """One compiled kernel, loaded and ready to launch."""

    def __init__(self, name: str, binary: bytes):
        raise _todo(self, "__init__", "load the Compiler's binary and find the kernel called "
                    "name in it")

    def __call__(self, buffers: list[Any], scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        raise _todo(self, "__call__", "launch grid workgroups of block threads each, with the "
                    "buffers, then the int32 scalars, as arguments")
