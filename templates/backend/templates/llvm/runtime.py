"""Runtime: host memory (Allocator), LLVM through llvmlite (Compiler), JIT launches (Program).

Starter: llvm. The Compiler parses the renderer's LLVM IR, optimises it (-O2, no fast math:
the ABI rounds each op, so nothing may be contracted into an FMA) and emits an object file for
the host CPU; the Program loads that object with LLVM's MCJIT and calls `pk_launch` with the
buffers' addresses, the scalar words and the grid. For your chip: emit your target's object
(its triple and CPU in `target_machine`), and launch through your driver.
"""
import ctypes
import functools
import threading
import time
from typing import Any

from portkit.abi import BackendUnavailable, CompileError, Compiler, HostAllocator, Program

FIX = "pip install llvmlite"
# LLVM's context is not thread-safe, and portkit compiles on several threads.
_LLVM_LOCK = threading.Lock()
_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.c_int32, ctypes.c_int32)


@functools.cache
def llvm() -> Any:
    """llvmlite.binding, initialised for the host; BackendUnavailable if it is missing."""
    try:
        from llvmlite import binding
    except ImportError as error:
        raise BackendUnavailable(f"llvmlite is not installed ({error})", FIX) from None
    binding.initialize_native_target()
    binding.initialize_native_asmprinter()
    return binding


def target_machine() -> Any:
    """The host CPU as an LLVM target, with all its features: a new one each time, because an
    MCJIT engine owns (and frees) the one it is given."""
    binding = llvm()
    target = binding.Target.from_default_triple()
    return target.create_target_machine(cpu=binding.get_host_cpu_name(),
                                        features=binding.get_host_cpu_features().flatten(),
                                        opt=2)


class {{ cookiecutter.__title }}Allocator(HostAllocator):
    """The host's memory: a buffer is a numpy byte array (the ABI's HostAllocator)."""


class {{ cookiecutter.__title }}Compiler(Compiler):
    """LLVM IR text in, an object file for the host CPU out."""

    def __init__(self):
        binding = llvm()
        self.machine = machine = target_machine()
        self.cpu = binding.get_host_cpu_name()
        # Objects built with one CPU's features run only on that CPU type: key the cache on it.
        self.cache_key = " ".join((f"llvm {binding.llvm_version_info}", machine.triple,
                                   self.cpu, binding.get_host_cpu_features().flatten()))

    def compile(self, source: str) -> bytes:
        with _LLVM_LOCK:
            return self._compile(source)

    def _compile(self, source: str) -> bytes:
        binding, machine = llvm(), self.machine
        try:
            module = binding.parse_assembly(source)
            module.verify()
        except RuntimeError as error:
            raise CompileError("LLVM rejected the kernel's IR (the IR is in .source)",
                               source, str(error)) from None
        module.triple, module.data_layout = machine.triple, str(machine.target_data)
        builder = binding.create_pass_builder(
            machine, binding.create_pipeline_tuning_options(speed_level=2))
        builder.getModulePassManager().run(module, builder)
        return machine.emit_object(module)


class {{ cookiecutter.__title }}Program(Program):
    """One kernel's object code, loaded by MCJIT; calling it runs the whole grid."""

    def __init__(self, name: str, binary: bytes):
        self.name = name
        with _LLVM_LOCK:
            binding = llvm()
            self.engine = binding.create_mcjit_compiler(binding.parse_assembly(""),
                                                        target_machine())
            self.engine.add_object_file(binding.ObjectFileRef.from_data(binary))
            self.engine.finalize_object()
            self.launch = _LAUNCH(self.engine.get_function_address("pk_launch"))

    def __call__(self, buffers: list, scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        pointers = (ctypes.c_void_p * max(len(buffers), 1))(*(b.ctypes.data for b in buffers))
        words = (ctypes.c_int32 * max(len(scalars), 1))(*scalars)
        start = time.perf_counter()
        self.launch(pointers, words, *grid)
        return time.perf_counter() - start if wait else None
